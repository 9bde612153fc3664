"""TensorFlow's Conv3D against the planner's estimate of it (plan.cc, TfEstimate),
per pass, on 3-D layers from 3x3x3 to 11x11x11: the measurement behind its
"trusted" row in TF_KERNEL_RULES (where TF runs oneDNN). Each pass is TF's raw op
(Conv3D, Conv3DBackpropInputV2, Conv3DBackpropFilterV2) in a tf.function, float32,
NDHWC, SAME; the best of 3 calls after a warm-up. Prints measured / estimated and
the planner's choice.

    python benchmarks/check_conv3d_estimate.py
"""
import time

import numpy as np
import tensorflow as tf

import tfbigconv  # noqa: F401  (applies the cost-model profile)
from tfbigconv import host
from tfbigconv.planning import planner

LAYERS = [((2, 16, 32, 32, 32), (3, 3, 3, 32, 32)), ((2, 16, 32, 32, 16), (5, 5, 5, 16, 16)),
          ((1, 16, 32, 32, 8), (7, 7, 7, 8, 8)), ((2, 16, 32, 32, 64), (3, 3, 3, 64, 64)),
          ((1, 24, 48, 48, 1), (9, 9, 9, 1, 4)), ((4, 8, 24, 24, 16), (3, 3, 3, 16, 32)),
          ((1, 16, 40, 40, 4), (11, 11, 11, 4, 4))]
ATTRS = dict(strides=[1] * 5, padding="SAME", explicit_paddings=[], data_format="NDHWC",
             dilations=[1] * 5)


def best_of(f, reps=3):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f().numpy()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    rng = np.random.default_rng(0)
    a = dict(strides=ATTRS["strides"], padding="SAME")
    print(f"TF runs oneDNN: {host.tf_onednn()}\n")
    print("| input | filter | pass | TF's Conv3D | estimate | measured / estimate | chosen |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for xs, ws in LAYERS:
        x = tf.constant(rng.standard_normal(xs), tf.float32)
        w = tf.constant(rng.standard_normal(ws), tf.float32)
        dy = tf.constant(rng.standard_normal(tf.raw_ops.Conv3D(input=x, filter=w, **a).shape),
                         tf.float32)
        calls = {
            "forward": tf.function(lambda: tf.raw_ops.Conv3D(input=x, filter=w, **a)),
            "backprop_input": tf.function(lambda: tf.raw_ops.Conv3DBackpropInputV2(
                input_sizes=xs, filter=w, out_backprop=dy, **a)),
            "backprop_filter": tf.function(lambda: tf.raw_ops.Conv3DBackpropFilterV2(
                input=x, filter_sizes=ws, out_backprop=dy, **a))}
        for pass_, call in calls.items():
            measured = best_of(call)
            p = planner.plan(pass_, xs, ws, ATTRS, "float32", "auto", 0, "CPU")
            est = p.tf.seconds
            ratios.append(measured / est)
            print(f"| {xs} | {ws} | {pass_} | {measured * 1e3:.1f} ms | {est * 1e3:.1f} ms | "
                  f"{measured / est:.2f} | {p['chosen']} |")
    print(f"\nmeasured / estimated over {len(ratios)} passes: {min(ratios):.2f} to "
          f"{max(ratios):.2f}, median {np.median(ratios):.2f}")


if __name__ == "__main__":
    main()
