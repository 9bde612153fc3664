"""bigconv2d under XLA (issue 39): its pure-TF path against TF's own convolution
under jit_compile and against our kernels outside XLA; and Keras fit steps per
second of a model with BigConv2D layers, with and without jit_compile.

Every (case, method) runs in a fresh process (_harness.run_worker); the first
call (tracing, XLA compilation, planning) is left out of the time, which is
the median of the following calls.

Targets (CPU): seed geometry at N=16, forward and fwd+bwd, >= 20x faster than
tf.nn.conv2d under jit_compile and within 2x of our kernels outside XLA;
depthwise (8,56,56,128) x 31^2 fwd+bwd >= 5x faster than
tf.nn.depthwise_conv2d under jit_compile.

    python benchmarks/bench_xla.py [--cases seed,depthwise,dense31] [--keras] [--reps 3]
    python benchmarks/bench_xla.py --rates   # TF's conv and the FFT under XLA, per layer
"""
import argparse
import os
import sys
import time

import _harness as H

CASES = {
    # name: (input NHWC, filter HWIO, padding)
    "seed": ((16, 321, 481, 1), (135, 135, 1, 3), "VALID"),
    "depthwise": ((8, 56, 56, 128), (31, 31, 1, 128), "SAME"),
    "dense31": ((4, 128, 128, 32), (31, 31, 32, 32), "SAME"),
}
# (case, pass, method): method "xla" (bigconv2d under jit_compile), "native" (bigconv2d,
# our kernels outside XLA), "tf_xla" (TF's op under jit_compile)
METHODS = ["xla", "native", "tf_xla"]


def worker(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv

    if spec["kind"] == "keras":
        return keras_worker(spec)
    xs, ws, padding = spec["x"], spec["w"], spec["padding"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(xs).astype(np.float32))
    w = tf.constant(rng.standard_normal(ws).astype(np.float32))
    depthwise = ws[2] == 1 and xs[3] > 1
    method = spec["method"]
    if method == "tf_xla":
        if depthwise:
            conv = (lambda x, w: tf.nn.depthwise_conv2d(  # noqa: E731
                x, tf.reshape(w, [ws[0], ws[1], xs[3], ws[3] // xs[3]]), [1, 1, 1, 1], padding))
        else:
            conv = lambda x, w: tf.nn.conv2d(x, w, 1, padding)  # noqa: E731
    else:
        alg = spec.get("algorithm", "auto")
        conv = lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding, algorithm=alg)  # noqa: E731
    jit = method in ("xla", "tf_xla")
    if spec["pass"] == "forward":
        step = tf.function(conv, jit_compile=jit)
    else:
        def train(x, w):
            with tf.GradientTape() as t:
                t.watch([x, w])
                y = conv(x, w)
                loss = tf.reduce_sum(y * y)
            return (loss,) + tuple(t.gradient(loss, [x, w]))
        step = tf.function(train, jit_compile=jit)
    call = lambda: [v.numpy() for v in tf.nest.flatten(step(x, w))]  # noqa: E731
    res = H.measure_call(call, spec["reps"])
    print(__import__("json").dumps(res))


def keras_worker(spec):
    """Steps per second of model.fit with BigConv2D, BigDepthwiseConv2D and BatchNorm."""
    import json

    import keras
    import numpy as np
    import tfbigconv

    keras.utils.set_random_seed(0)
    k = spec["k"]
    model = keras.Sequential([
        keras.Input((96, 96, 3)),
        tfbigconv.keras.BigConv2D(16, k, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        tfbigconv.keras.BigDepthwiseConv2D(k, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1)])
    model.compile("sgd", "mse", jit_compile=spec["jit"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96, 96, 3)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # traces, compiles, plans
    start = time.perf_counter()
    model.fit(x, y, batch_size=8, epochs=spec["epochs"], verbose=0)
    steps = 8 * spec["epochs"]
    print(json.dumps({"median_s": (time.perf_counter() - start) / steps,
                      "steps_per_s": steps / (time.perf_counter() - start)}))


RATE_CASES = [((8, 56, 56, 64), (3, 3, 64, 64)), ((8, 56, 56, 128), (3, 3, 1, 128)),
              ((8, 56, 56, 128), (7, 7, 1, 128)), ((8, 56, 56, 128), (13, 13, 1, 128)),
              ((4, 64, 64, 32), (7, 7, 32, 32)), ((4, 64, 64, 32), (15, 15, 32, 32))]


def rates(reps_s=1.0):
    """TF's convolution and the FFT, both under XLA, forward SAME, per layer:
    the measurements behind pure_tf.estimates (in this process, warm)."""
    import numpy as np
    import tensorflow as tf
    import tfbigconv

    def timed(fn, *a):
        fn(*a).numpy()
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < reps_s or n < 2:
            fn(*a).numpy()
            n += 1
        return (time.perf_counter() - start) / n

    rows = ["| layer | TF's conv under XLA | GFLOP/s | FFT under XLA | estimates (conv, fft) | "
            "rule picks |", "|---|---|---|---|---|---|"]
    for xs, ws in RATE_CASES:
        x = tf.constant(np.random.default_rng(0).standard_normal(xs).astype(np.float32))
        w = tf.constant(np.random.default_rng(1).standard_normal(ws).astype(np.float32))
        t = {alg: timed(tf.function(lambda x, w: tfbigconv.bigconv2d(
            x, w, 1, "SAME", algorithm=alg), jit_compile=True), x, w) for alg in ("direct", "fft")}
        flops = 2.0 * xs[0] * xs[1] * xs[2] * ws[3] * ws[0] * ws[1] * ws[2]
        e = tfbigconv.explain(xs, ws, padding="SAME", xla=True)
        rows.append(f"| {xs}x{ws} | {t['direct'] * 1e3:.1f} ms | {flops / t['direct'] / 1e9:.1f} | "
                    f"{t['fft'] * 1e3:.1f} ms | {e.tf_seconds * 1e3:.1f}, "
                    f"{e.fft_seconds * 1e3:.1f} ms | {e.chosen['forward']} |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="seed,depthwise")
    ap.add_argument("--passes", default="forward,fwd+bwd")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="contenders to run (TF under XLA takes minutes on the seed case)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--keras", action="store_true", help="also Keras fit steps/s, jit on and off")
    ap.add_argument("--ks", default="7,31", help="filter sizes of the Keras model")
    ap.add_argument("--rates", action="store_true",
                    help="only the per-layer rates behind pure_tf.estimates (one process)")
    args = H.parse_args_or_work(ap, worker)
    import tensorflow as tf
    _, _, header = H.run_header(tf.__version__)
    if args.rates:
        print(header + "\n\n" + "\n".join(rates()))
        return
    rows = [] if not args.cases else ["| case | pass | bigconv2d under XLA | our kernels (no XLA) | TF under XLA | "
            "XLA path vs TF under XLA | XLA path vs our kernels |", "|---|---|---|---|---|---|---|"]
    for name in [c for c in args.cases.split(",") if c]:
        xs, ws, padding = CASES[name]
        for pass_ in args.passes.split(","):
            methods = args.methods.split(",")
            specs = {m: dict(kind="conv", x=xs, w=ws, padding=padding, pass_=None, method=m,
                             reps=args.reps) for m in methods}
            for s in specs.values():
                s["pass"] = pass_
                s.pop("pass_")
            best = H.best_of_rounds(__file__, specs, args.rounds, f"{name} {pass_}")
            t = {m: best[m].get("median_s", float("nan")) if m in best and "error" not in best[m]
                 else float("nan") for m in METHODS}
            rows.append(f"| {name} {xs}x{ws[:2]} | {pass_} | {1e3 * t['xla']:.1f} ms | "
                        f"{1e3 * t['native']:.1f} ms | {1e3 * t['tf_xla']:.1f} ms | "
                        f"{t['tf_xla'] / t['xla']:.1f}x faster | {t['xla'] / t['native']:.2f}x "
                        f"the time |")
    if args.keras:
        rows += ["", "| Keras model (96x96x3, batch 8, K) | jit_compile=False steps/s | "
                 "jit_compile=True steps/s |", "|---|---|---|"]
        for k in (int(v) for v in args.ks.split(",")):
            specs = {jit: dict(kind="keras", k=k, jit=jit, epochs=2) for jit in (False, True)}
            best = H.best_of_rounds(__file__, specs, args.rounds, f"keras K={k}")
            sps = {jit: best[jit].get("steps_per_s", float("nan")) for jit in (False, True)}
            rows.append(f"| BigConv2D + BigDepthwiseConv2D + BatchNorm, K={k} | "
                        f"{sps[False]:.1f} | {sps[True]:.1f} |")
    print(header)
    print()
    print("\n".join(rows))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
