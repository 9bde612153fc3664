"""The motivating case: video frames (N, 321, 481, 1) convolved with a
135x135x1x3 filter, VALID, float32; bigconv2d against tf.nn.conv2d.

Each method runs in its own subprocess: peak RSS increase of its first call
over the inputs (after a one-frame warm-up), and the best time of the next
three calls (one for tf.nn.conv2d). tf.nn.conv2d takes about 0.1 s per frame here,
so N defaults to 16; pass --batch 200 for the full case (minutes).

    python benchmarks/demo.py [--batch N]
"""
import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, sys, time
import numpy as np
import tensorflow as tf
import tfbigconv
method, n = sys.argv[1], int(sys.argv[2])
# Separate streams: the first frames and the filter must not depend on n.
x = tf.constant(np.random.default_rng(0).standard_normal((n, 321, 481, 1), dtype=np.float32))
w = tf.constant(np.random.default_rng(1).standard_normal((135, 135, 1, 3), dtype=np.float32))
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
conv = {"tf.nn.conv2d": tf.nn.conv2d, "bigconv2d": tfbigconv.bigconv2d}[method]
conv(x[:1], w, 1, "VALID").numpy()  # warm up the runtime on one frame
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
y = conv(x, w, 1, "VALID")  # first call: its peak memory (before any numpy copy)
peak = status("VmHWM")
out_bytes = y.shape.num_elements() * 4
del y
times = []
for _ in range(1 if method == "tf.nn.conv2d" else 3):  # tf.nn.conv2d is slow: one call
    t = time.perf_counter()
    conv(x, w, 1, "VALID").numpy()
    times.append(time.perf_counter() - t)
np.save(sys.argv[3], conv(x[:2], w, 1, "VALID").numpy())
print(json.dumps({"time": min(times), "rss": peak - before, "out_bytes": out_bytes}))
"""


def run(method, n, out_file):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # cwd: not the repository root, whose tfbigconv/ has no compiled modules.
    res = subprocess.run([sys.executable, "-c", WORKER, method, str(n), out_file], env=env,
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    if res.returncode != 0:
        sys.exit(f"{method} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--tf-batch", type=int, default=16,
                    help="frames for tf.nn.conv2d; its time is scaled to --batch")
    args = ap.parse_args()
    import numpy as np
    import tempfile
    n = args.batch
    in_bytes = n * 321 * 481 * 4
    print(f"input ({n}, 321, 481, 1) float32 ({in_bytes / 2**20:.0f} MiB), filter (135, 135, 1, 3), VALID")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, frames in (("bigconv2d", n), ("tf.nn.conv2d", min(n, args.tf_batch))):
            path = os.path.join(tmp, method + ".npy")
            r = run(method, frames, path)
            r["sample"] = np.load(path)
            scale = n / frames
            r["scaled_time"] = r["time"] * scale
            results[method] = r
            note = f"   ({frames} frames, time scaled x{scale:g})" if scale != 1 else ""
            print(f"  {method:14s} {r['scaled_time']:8.3f} s   peak RSS increase "
                  f"{r['rss'] / 2**20:7.0f} MiB (output {r['out_bytes'] / 2**20:.0f} MiB){note}",
                  flush=True)
    a, b = results["bigconv2d"]["sample"].astype(np.float64), results["tf.nn.conv2d"]["sample"]
    err = np.linalg.norm(a - b) / np.linalg.norm(b)
    speed = results["tf.nn.conv2d"]["scaled_time"] / results["bigconv2d"]["scaled_time"]
    print(f"bigconv2d is {speed:.0f}x faster than tf.nn.conv2d; relative L2 difference {err:.1e}")


if __name__ == "__main__":
    main()
