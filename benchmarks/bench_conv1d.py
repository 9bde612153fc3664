"""Long 1-D convolutions (issue 38): bigconv1d against a hand-written TensorFlow FFT
convolution and against TensorFlow's own route.

Cases (CAUSAL, depthwise, float32, NWC):
  hyena:    x (8, 16384, 256), filter (16384, 1, 256), Hyena-style (a filter as long as
            the sequence). Targets: fwd+bwd >= 2x faster than the hand-written FFT
            convolution, with a peak RSS increase at most half of its.
  tf_route: x (1, 2048, 16), filter (2048, 1, 16). TensorFlow's route,
            tf.nn.depthwise_conv2d with height 1. Targets: >= 100x faster, with at most
            5% of its peak RSS increase.

The hand-written FFT convolution is what users write (safari's fftconv_ref): pad to
2L, tf.signal.rfft, multiply, irfft, crop; its filter is ours reversed (a causal
convolution, where ours is a correlation), and the worker checks that both agree.

Every (case, method) runs in a fresh process; the peak RSS increase is the first
call's (planning included), the time the median of the calls after it: --reps of
them, and more while they took under --min-time seconds in all (a 2 ms step's median
over 3 calls read 20-40% high).

    python benchmarks/bench_conv1d.py [--cases hyena,tf_route] [--passes forward,fwd+bwd]
"""
import argparse
import json
import os
import sys

import _harness as H

CASES = {
    "hyena": ((8, 16384, 256), (16384, 1, 256)),
    "tf_route": ((1, 2048, 16), (2048, 1, 16)),
}
# which contenders each case runs (TF's route dies of std::bad_alloc from L = 4096)
METHODS = {"hyena": ["ours", "tf_fft"], "tf_route": ["ours", "tf_fft", "tf"]}


def hand_written_fft(x, w):
    """The causal depthwise convolution users write by hand (NWC; w is [K, 1, C])."""
    import tensorflow as tf

    length, k = x.shape[1], w.shape[0]
    n = 2 * max(length, k)
    u = tf.transpose(x, [0, 2, 1])                   # (B, C, L)
    kern = tf.reverse(tf.transpose(w[:, 0, :]), [1])  # (C, K): convolution, not correlation
    y = tf.signal.irfft(tf.signal.rfft(u, [n]) * tf.signal.rfft(kern, [n]), [n])[..., :length]
    return tf.transpose(y, [0, 2, 1])


def tf_route(x, w):
    """tf.nn.depthwise_conv2d with height 1 after causal padding."""
    import tensorflow as tf

    k = w.shape[0]
    xp = tf.pad(x, [[0, 0], [k - 1, 0], [0, 0]])[:, None]
    return tf.nn.depthwise_conv2d(xp, tf.reshape(w, [1, k, w.shape[2], 1]), [1, 1, 1, 1],
                                  "VALID")[:, 0]


def worker(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv

    xs, ws = spec["x"], spec["w"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(xs).astype(np.float32))
    w = tf.constant((rng.standard_normal(ws) / np.sqrt(ws[0])).astype(np.float32))
    conv = {"ours": lambda x, w: tfbigconv.bigconv1d(x, w, 1, "CAUSAL"),
            "tf_fft": hand_written_fft, "tf": tf_route}[spec["method"]]
    if spec["method"] != "tf" or xs[1] <= 2048:  # the contenders agree
        small = (x[:1, :512], w[:300])
        ref = tfbigconv.bigconv1d(*small, 1, "CAUSAL", algorithm="direct")
        err = H.rel_l2(conv(*small).numpy(), ref.numpy())
        assert err < 1e-4, f"{spec['method']} disagrees with bigconv1d: rel L2 {err:.2e}"
    if spec["pass"] == "forward":
        step = tf.function(conv)
        call = lambda: step(x, w).numpy()  # noqa: E731
    else:
        g_out = tf.constant(rng.standard_normal(xs).astype(np.float32))
        call = H.build_step(conv, x, w, g_out)
    res = H.measure_call(call, spec["reps"], min_time_s=spec["min_time"])
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="hyena,tf_route")
    ap.add_argument("--passes", default="forward,fwd+bwd")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--min-time", type=float, default=2.0,
                    help="seconds of timed calls at least (more than --reps for short calls)")
    args = H.parse_args_or_work(ap, worker)
    import tensorflow as tf
    _, _, header = H.run_header(tf.__version__)
    rows = list(H.CONTENDER_HEADER)
    for name in args.cases.split(","):
        xs, ws = CASES[name]
        for pass_ in args.passes.split(","):
            specs = {m: dict(x=xs, w=ws, method=m, reps=args.reps, min_time=args.min_time)
                     for m in METHODS[name]}
            for s in specs.values():
                s["pass"] = pass_
            best = H.best_of_rounds(__file__, specs, args.rounds, f"{name} {pass_}")
            rows += H.contender_rows(f"{name} {xs}x{ws}", pass_, best)
    print(header)
    print()
    print("\n".join(rows))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
