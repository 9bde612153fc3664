"""Issue 40's first-call reproducer: a Keras model with one BigConv2D(8, 31), its first
and second train_on_batch, in this fresh process with an empty autotune cache.

    python benchmarks/first_call.py [--policy mixed_bfloat16|mixed_float16|float32] [--stock]

--stock times Keras' own Conv2D(8, 31) instead: the stock layer's first step, which
issue 59's target compares with where TF's kernel wins.
"""
import argparse
import os
import tempfile
import time

os.environ["TFBIGCONV_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfbigconv  # noqa: E402,F401
from tfbigconv.keras import BigConv2D  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="mixed_bfloat16")
    parser.add_argument("--stock", action="store_true", help="Keras' Conv2D, not BigConv2D")
    args = parser.parse_args()
    keras.mixed_precision.set_global_policy(args.policy)
    layer = (keras.layers.Conv2D if args.stock else BigConv2D)(8, 31, padding="same")
    model = keras.Sequential([keras.Input((96, 96, 3)), layer])
    model.compile(optimizer="sgd", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.random((8, 96, 96, 3), dtype=np.float32)
    y = rng.random((8, 96, 96, 8), dtype=np.float32)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    print(f"{args.policy}, {type(layer).__name__}: first train_on_batch {times[0]:.2f} s, "
          f"second {times[1]:.3f} s "
          f"(TFBIGCONV_AUTOTUNE={os.environ.get('TFBIGCONV_AUTOTUNE', '1')})")


if __name__ == "__main__":
    main()
