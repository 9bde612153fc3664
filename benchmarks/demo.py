"""The motivating case: video frames (N, 321, 481, 1) convolved with a
135x135x1x3 filter, VALID, float32; bigconv2d against tf.nn.conv2d.

Each method runs in its own subprocess (time of the second call, peak RSS
increase over the inputs). tf.nn.conv2d takes about 0.1 s per frame here,
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
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((n, 321, 481, 1), dtype=np.float32))
w = tf.constant(rng.standard_normal((135, 135, 1, 3), dtype=np.float32))
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
fn = {"tf.nn.conv2d": lambda: tf.nn.conv2d(x, w, 1, "VALID"),
      "bigconv2d": lambda: tfbigconv.bigconv2d(x, w, 1, "VALID")}[method]
fn()  # warm-up
y = None
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
t = time.perf_counter()
y = fn().numpy()
dt = time.perf_counter() - t
peak = status("VmHWM")
np.save(sys.argv[3], y[:2])
print(json.dumps({"time": dt, "rss": peak - before, "out_bytes": y.nbytes}))
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
