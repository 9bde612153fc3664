"""Written against allocated: the RSS one fft filter-gradient call adds, next to its planned workspace.

The case is the 135x135 conv of bench_memory_report.py (x: (N, 321, 481, 1),
filter 135x135x1x3, VALID), whose converted training step peaks in this op.
Each (batch, intra-op threads) runs in a fresh subprocess with glibc's mmap
threshold at 64 KiB (freed blocks leave the RSS at once): two warm-up calls,
then 5 calls, each measured as VmHWM - VmRSS before it (after resetting the
high-water mark). RSS counts only pages written, so the difference to the
planned workspace + output is the part of the allocation that is never written.

  .venv/bin/python benchmarks/bench_fft_workspace_rss.py      # batches 1, 2; threads 1, 2
"""
import json
import os
import subprocess
import sys

ATTRS = dict(strides=[1, 1, 1, 1], padding="VALID", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
FILTER = [135, 135, 1, 3]


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


def measure_here(batch, threads):
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    from tfbigconv import _core, host
    from tfbigconv._native import ops
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, 321, 481, 1), np.float32))
    dy = tf.constant(rng.standard_normal((batch, 187, 347, 3), np.float32))

    def run():
        return ops.big_conv2d_backprop_filter(x, FILTER, dy, algorithm="fft",
                                              workspace_limit_bytes=0, **ATTRS)
    for _ in range(2):
        run()
    seen = []
    for _ in range(5):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status("VmRSS")
        r = run()
        seen.append(_status("VmHWM") - before)
        del r
    # The filter gradient posed as a convolution (geometry.cc): input x with
    # batch and channels swapped, filter dy, output the filter's shape.
    plan = _core.fft_plan([1, 321, 481, batch], [187, 347, batch, 3], workers=host.workers(),
                          dtype="float32", **ATTRS)
    print(json.dumps({"seen": seen, "plan": {k: getattr(plan, k) for k in (
        "workspace_bytes", "filter_spectra_bytes", "item_spectra_bytes", "worker_bytes",
        "workers", "chunk")}}))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--measure":
        return measure_here(int(sys.argv[2]), int(sys.argv[3]))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="65536")
    mib = lambda n: f"{n / 2**20:.2f}"
    output = 135 * 135 * 3 * 4
    print("| batch | threads | workers | planned workspace MiB (filter spectra + items + workers x each) "
          "| planned + output MiB | measured MiB (5 calls) | never written MiB |")
    print("|---|---|---|---|---|---|---|")
    for batch in (1, 2):
        for threads in (1, 2):
            r = subprocess.run([sys.executable, __file__, "--measure", str(batch), str(threads)],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"| {batch} | {threads} | failed: {r.stderr.strip().splitlines()[-1]} |")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            p, seen = d["plan"], d["seen"]
            total = p["workspace_bytes"] + output
            print(f"| {batch} | {threads} | {p['workers']} | {mib(p['workspace_bytes'])} "
                  f"({mib(p['filter_spectra_bytes'])} + {p['chunk']} x {mib(p['item_spectra_bytes'])}"
                  f" + {p['workers']} x {mib(p['worker_bytes'])}) | {mib(total)} | "
                  f"{mib(min(seen))}-{mib(max(seen))} | {mib(total - max(seen))}-{mib(total - min(seen))} |",
                  flush=True)


if __name__ == "__main__":
    main()
