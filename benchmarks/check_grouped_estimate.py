"""TF's grouped Conv2D against its estimate, per pass and dtype (why oneDNN's is
trusted from tf_rules.ONEDNN_GROUPED_TRUSTED_CHANNELS channels per group).

    python benchmarks/check_grouped_estimate.py [--dtypes float32,bfloat16,float16]

Prints measured / estimated for each layer and pass (RESULTS.md, "Grouped
Conv2D under oneDNN"). Runs TF's kernels on the CPU; float16 filter gradients
take seconds a call on some hosts.
"""
import argparse

import tensorflow as tf

from tfbigconv.cost_model import calibrate
from tfbigconv.planning import planner

ATTRS = dict(strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
             dilations=[1, 1, 1, 1])
# (input NHWC, filter HWIO): groups = input channels / filter input channels.
LAYERS = (
    ((8, 56, 56, 64), (7, 7, 2, 64)),
    ((8, 56, 56, 64), (7, 7, 4, 64)),
    ((8, 56, 56, 64), (7, 7, 8, 64)),
    ((8, 56, 56, 64), (7, 7, 16, 64)),
    ((32, 28, 28, 16), (3, 3, 4, 16)),
    ((16, 32, 32, 32), (5, 5, 16, 64)),
    ((8, 56, 56, 128), (3, 3, 32, 128)),
    ((4, 64, 64, 32), (15, 15, 8, 32)),
    ((8, 32, 32, 256), (3, 3, 64, 256)),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    args = parser.parse_args()
    for x, w in LAYERS:
        for dtype in args.dtypes.split(","):
            cells = []
            for pass_ in planner.PASSES:
                estimate = planner.plan(pass_, x, w, ATTRS, dtype, "auto", 0).tf.seconds
                fn = calibrate.im2col_fn(pass_, x, w, "SAME", tf.as_dtype(dtype))
                with tf.device("/CPU:0"):
                    took = calibrate._time(fn, 0.2, reps=3)
                cells.append(f"{pass_} {took * 1e3:.2f}/{estimate * 1e3:.2f} ms = {took / estimate:.2f}")
            print(f"{x} x {w} {dtype}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
