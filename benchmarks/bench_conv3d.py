"""3-D convolutions with large filters (issue 38): bigconv3d against tf.nn.conv3d and a
hand-written TensorFlow 3-D FFT convolution (tf.signal.rfft3d), and the motivating case
in 3-D against bigconv2d.

Cases (float32, NDHWC):
  depthwise21: x (2, 48, 48, 48, 64), depthwise 21^3, SAME (RepUX-Net-like). Target:
               fwd+bwd >= 3x faster than the hand-written 3-D FFT convolution; what
               TensorFlow's grouped Conv3D does on the CPU is recorded.
  dense15:     x (2, 32, 64, 64, 16), filter 15^3 x 16 x 16, SAME. Target: fwd+bwd
               >= 5x faster than tf.nn.conv3d, with a lower peak RSS.
  seed3d:      x (1, 200, 321, 481, 1), filter (1, 135, 135, 1, 3), VALID, forward.
               Target: within 1.2x of bigconv2d on (200, 321, 481, 1) ("seed2d").
  seed3d5:     the same with a (5, 135, 135, 1, 3) filter; seed3d5_tf: tf.nn.conv3d on
               12 frames (8 output frames), to be scaled to 196. Target: >= 100x faster
               than tf.nn.conv3d, with bounded memory.

Every (case, method) runs in a fresh process; the peak RSS increase is the first
call's, the time the median of the calls after it. A contender that fails records
its error.

    python benchmarks/bench_conv3d.py [--cases depthwise21,dense15,seed3d] [--passes ...]
"""
import argparse
import json
import os
import sys

import _harness as H

CASES = {
    "depthwise21": ((2, 48, 48, 48, 64), (21, 21, 21, 1, 64), "SAME"),
    "dense15": ((2, 32, 64, 64, 16), (15, 15, 15, 16, 16), "SAME"),
    "seed3d": ((1, 200, 321, 481, 1), (1, 135, 135, 1, 3), "VALID"),
    # a filter 5 frames deep; tf.nn.conv3d is timed on 12 frames (8 output frames)
    "seed3d5": ((1, 200, 321, 481, 1), (5, 135, 135, 1, 3), "VALID"),
    "seed3d5_tf": ((1, 12, 321, 481, 1), (5, 135, 135, 1, 3), "VALID"),
}
METHODS = {"depthwise21": ["ours", "tf_fft", "tf"], "dense15": ["ours", "tf"],
           "seed3d": ["ours", "seed2d"], "seed3d5": ["ours"], "seed3d5_tf": ["tf"]}
FORWARD_ONLY = ("seed3d", "seed3d5", "seed3d5_tf")


def hand_written_fft3d(x, w, padding):
    """Depthwise 3-D correlation by FFT as users write it in TensorFlow: SAME only.
    TensorFlow registers no gradient for RFFT3D/IRFFT3D, so it is the complex
    tf.signal.fft3d of the zero-padded tensors (which has one)."""
    import tensorflow as tf

    assert padding == "SAME"
    d, h, wd, c = x.shape[1:]
    k = w.shape[:3]
    n = [d + k[0] - 1, h + k[1] - 1, wd + k[2] - 1]
    u = tf.transpose(x, [0, 4, 1, 2, 3])                           # (N, C, D, H, W)
    f = tf.transpose(w[:, :, :, 0, :], [3, 0, 1, 2])              # (C, kd, kh, kw)

    def fft(t):
        pads = [[0, 0]] * (len(t.shape) - 3) + [[0, n[i] - t.shape[-3 + i]] for i in range(3)]
        return tf.signal.fft3d(tf.cast(tf.pad(t, pads), tf.complex64))
    spec = fft(u) * tf.math.conj(fft(f))
    corr = tf.math.real(tf.signal.ifft3d(spec))                    # circular correlation
    p = [(ki - 1) // 2 for ki in k]
    y = tf.roll(corr, p, axis=[2, 3, 4])[:, :, :d, :h, :wd]
    return tf.transpose(y, [0, 2, 3, 4, 1])


def worker(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv

    xs, ws, padding = spec["x"], spec["w"], spec["padding"]
    method = spec["method"]
    rng = np.random.default_rng(0)
    if method == "seed2d":
        xs, ws = xs[1:], ws[1:]
    x = tf.constant(rng.standard_normal(xs).astype(np.float32))
    w = tf.constant((rng.standard_normal(ws) / np.sqrt(np.prod(ws[:3]))).astype(np.float32))
    conv = {"ours": lambda x, w: tfbigconv.bigconv3d(x, w, 1, padding),
            "tf": lambda x, w: tf.nn.conv3d(x, w, [1] * 5, padding),
            "tf_fft": lambda x, w: hand_written_fft3d(x, w, padding),
            "seed2d": lambda x, w: tfbigconv.bigconv2d(x, w, 1, padding)}[method]
    if method == "tf_fft":  # agrees with ours on a corner of the case
        small = (x[:1, :12, :12, :12, :4], w[:5, :5, :5, :, :4])
        err = H.rel_l2(conv(*small).numpy(),
                       tfbigconv.bigconv3d(*small, 1, padding, algorithm="direct").numpy())
        assert err < 1e-4, f"tf_fft disagrees with bigconv3d: rel L2 {err:.2e}"
    if spec["pass"] == "forward":
        step = tf.function(conv)
        call = lambda: step(x, w).numpy()  # noqa: E731
    else:
        shape = conv(x[:1], w).shape
        g_out = tf.constant(rng.standard_normal([xs[0]] + shape[1:].as_list()).astype(np.float32))
        call = H.build_step(conv, x, w, g_out)
    print(json.dumps(H.measure_call(call, spec["reps"], budget_s=spec.get("budget_s"))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="depthwise21,dense15,seed3d")
    ap.add_argument("--passes", default="fwd+bwd")
    ap.add_argument("--methods", default=None, help="only these contenders")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds of calls per contender after its first")
    args = H.parse_args_or_work(ap, worker)
    import tensorflow as tf
    _, _, header = H.run_header(tf.__version__)
    rows = list(H.CONTENDER_HEADER)
    for name in args.cases.split(","):
        xs, ws, padding = CASES[name]
        passes = ["forward"] if name in FORWARD_ONLY else args.passes.split(",")
        for pass_ in passes:
            methods = [m for m in METHODS[name]
                       if not args.methods or m in args.methods.split(",")]
            specs = {m: {"x": xs, "w": ws, "padding": padding, "method": m, "pass": pass_,
                         "reps": args.reps, "budget_s": args.budget} for m in methods}
            best = H.best_of_rounds(__file__, specs, args.rounds, f"{name} {pass_}")
            rows += H.contender_rows(f"{name} {xs}x{ws}", pass_, best)
    print(header)
    print()
    print("\n".join(rows))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
