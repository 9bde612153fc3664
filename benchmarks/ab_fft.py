"""One side of an A/B of the CPU fft kernel: per case, algorithm="fft" forward + both
gradients under tf.function (loss sum(y * g) for a fixed random g), median ms of REPS
calls after one untimed, and minor page faults per call; prints one JSON line. Run it
alternately against two installs, e.g.

    for i in 1 2 3 4; do for v in base new; do
      PYTHONPATH=/tmp/pkg_$v python benchmarks/ab_fft.py --reps 8; done; done

where /tmp/pkg_base holds a wheel of the old commit (pip install --no-deps --target).

Usage: python benchmarks/ab_fft.py [--reps 8] [--cases depthwise,seed_n2,...]
"""
import argparse
import json
import resource
import time

import numpy as np
import tensorflow as tf
import tfbigconv

import _harness

CASES = {  # name: (input NHWC, filter HWIO, padding)
    "depthwise": ((8, 56, 56, 128), (31, 31, 1, 128), "SAME"),  # issue 11's acceptance case
    "seed_n2": ((2, 321, 481, 1), (135, 135, 1, 3), "VALID"),
    "dense": ((1, 128, 128, 32), (31, 31, 32, 32), "SAME"),
    "grouped": ((4, 64, 64, 64), (15, 15, 8, 64), "SAME"),
    "depthwise13": ((4, 56, 56, 64), (13, 13, 1, 64), "SAME"),
    "small_dense": ((16, 32, 32, 3), (9, 9, 3, 64), "SAME"),
    # plans that the fft planner's compounding memory slack moved (fixed 2026-11-23)
    "wide15": ((1, 321, 358, 128), (15, 15, 128, 64), "SAME"),
    "wide31": ((8, 321, 358, 16), (31, 31, 16, 64), "SAME"),
}


def measure(x_shape, w_shape, padding, reps):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(x_shape, dtype=np.float32))
    w = tf.constant(rng.standard_normal(w_shape, dtype=np.float32))
    y_shape = tfbigconv.bigconv2d(x[:1], w, 1, padding, algorithm="fft").shape[1:]
    g = tf.constant(rng.standard_normal((x_shape[0],) + tuple(y_shape), dtype=np.float32))
    step = _harness.build_step(
        lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding, algorithm="fft"), x, w, g)
    step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"ms": round(float(np.median(times)) * 1e3, 1), "minor_faults": faults // reps}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--cases", default="depthwise")
    a = p.parse_args()
    out = {name: measure(*CASES[name], a.reps) for name in a.cases.split(",")}
    out["package"] = tfbigconv.__file__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
