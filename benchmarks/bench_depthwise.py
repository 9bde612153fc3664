"""Issue 11's depthwise acceptance case: auto against tf.nn.depthwise_conv2d, fwd + bwd.

Case: x (8, 56, 56, 128), w (31, 31, 1, 128), stride 1, SAME, float32, NHWC; one call
computes y = conv(x, w) and both gradients of sum(y * g) for a fixed random g, under
tf.function. Target: auto at least 10x faster than tf.nn.depthwise_conv2d.

Contenders, each in its own fresh subprocess (machinery: _harness.py):
    auto     tfbigconv.bigconv2d(x, w, 1, "SAME"): autotuning on, with an empty cache
             file of its own (TFBIGCONV_AUTOTUNE_CACHE), so the first call tunes cold
    tf       tf.nn.depthwise_conv2d with the filter reshaped to (31, 31, 128, 1), and
             TensorFlow's gradients (DepthwiseConv2dNative*)
    fft      bigconv2d(..., algorithm="fft") for every pass
    direct   bigconv2d(..., algorithm="direct") for every pass
Each worker first pays the process's one-time costs on a tiny convolution, then times
the first call (tracing, planning, autotuning for auto, one run) and 3 more calls
(their median counts). The contenders run round-robin for --rounds rounds; the round with
the smallest median counts. Every contender's gradients are checked against tf's
(relative L2 of dx and dw under 1e-3) so that no wrong result is timed.

Usage:
    python benchmarks/bench_depthwise.py [--rounds 2] [--out F.md] [--json F.json]
"""
import argparse
import json
import sys

import _harness

X_SHAPE = (8, 56, 56, 128)
W_SHAPE = (31, 31, 1, 128)
CONTENDERS = ("auto", "tf", "fft", "direct")
TARGET_SPEEDUP = 10.0
AGREE_TOL = 1e-3  # float32; TF's own kernels and ours differ by ~1e-6 here
PASSES = ("forward", "backprop_input", "backprop_filter")


def worker(spec):
    with _harness.fresh_autotune_env():
        print(json.dumps(measure(spec["contender"], spec["reps"])))


def measure(contender, reps):
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(X_SHAPE, dtype=np.float32))
    w = tf.constant(rng.standard_normal(W_SHAPE, dtype=np.float32))
    g = tf.constant(rng.standard_normal(X_SHAPE, dtype=np.float32))  # SAME, stride 1
    if contender == "tf":
        dw_shape = (W_SHAPE[0], W_SHAPE[1], X_SHAPE[3], W_SHAPE[3] // X_SHAPE[3])

        def conv(x, w):
            return tf.nn.depthwise_conv2d(x, tf.reshape(w, dw_shape), [1, 1, 1, 1], "SAME")
    else:
        def conv(x, w):
            return tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=contender)
    _harness.warm_up()
    step = _harness.build_step(conv, x, w, g)
    # kept: the gradients themselves, for the parent's agreement check (every 97th value: ~1 MiB of JSON)
    m = _harness.measure_call(step, reps=reps, keep=lambda grads: [
        v.astype(np.float64).ravel()[::97].tolist() for v in grads])
    out = {"median_s": m["median_s"], "times_s": m["times_s"], "first_call_s": m["warmup_s"],
           "sample": m["kept"]}
    if contender == "auto":  # what auto ran, "*" where the autotuner measured it
        e = tfbigconv.explain(X_SHAPE, W_SHAPE, 1, "SAME")
        out["chosen"] = "/".join(e.chosen[p] + ("*" if e.how.get(p) == "measured" else "")
                                 for p in PASSES)
    return out


def rel_l2(a, b):
    import numpy as np
    a, b = np.asarray(a), np.asarray(b)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="timed calls after the first")
    p.add_argument("--out", help="append the result, with the command, to this file")
    p.add_argument("--json", help="write the raw results here")
    args = _harness.parse_args_or_work(p, worker)
    import tensorflow as tf

    best = {}
    for rnd in range(args.rounds):
        for c in CONTENDERS:
            res = _harness.run_worker(__file__, {"contender": c, "reps": args.reps})
            best[c] = _harness.better(best.get(c), res)
            status = res["error"] if "error" in res else (
                f"{1e3 * res['median_s']:.1f} ms (first call {res['first_call_s']:.2f} s)")
            print(f"  {c} round {rnd + 1}: {status}", file=sys.stderr)

    ref = best["tf"].get("sample")
    rows = ["| contender | median ms (3 calls) | first call s | vs tf.nn.depthwise_conv2d | "
            "gradients vs tf (rel. L2 dx, dw) |", "|---|---|---|---|---|"]
    for c in CONTENDERS:
        r = best[c]
        if "error" in r:
            rows.append(f"| {c} | error: {r['error'][:80]} | | | |")
            continue
        speedup = (best["tf"]["median_s"] / r["median_s"]) if "median_s" in best["tf"] else None
        agree = "-"
        if ref and c != "tf":
            errs = [rel_l2(a, b) for a, b in zip(r["sample"], ref)]
            agree = ", ".join(f"{e:.1e}" for e in errs) + ("" if max(errs) < AGREE_TOL else " WRONG")
        name = f"auto ({r['chosen']})" if c == "auto" and "chosen" in r else c
        vs_tf = "reference" if c == "tf" else f"{speedup:.1f}x faster" if speedup else "-"
        rows.append(f"| {name} | {1e3 * r['median_s']:.1f} | {r['first_call_s']:.2f} | "
                    f"{vs_tf} | {agree} |")

    auto, tfr = best["auto"], best["tf"]
    if "median_s" in auto and "median_s" in tfr:
        speedup = tfr["median_s"] / auto["median_s"]
        verdict = "met" if speedup >= TARGET_SPEEDUP else "MISSED"
        line = (f"Depthwise {X_SHAPE} x {W_SHAPE} SAME float32, fwd + both gradients: "
                f"auto {1e3 * auto['median_s']:.0f} ms (first call {auto['first_call_s']:.2f} s: "
                f"tracing, planning, autotuning, one run), tf.nn.depthwise_conv2d "
                f"{1e3 * tfr['median_s']:.0f} ms: auto is {speedup:.1f}x faster "
                f"(target >= {TARGET_SPEEDUP:g}x): {verdict}")
    else:
        line = f"Depthwise case: auto {auto.get('error', 'ok')}, tf {tfr.get('error', 'ok')}"
    _, _, header = _harness.run_header(tf.__version__)
    body = "\n".join([line, ""] + rows)
    raw = {c: {k: v for k, v in r.items() if k != "sample"} for c, r in best.items()}
    _harness.publish(args, "bench_depthwise", header, body,
                     {"x_shape": X_SHAPE, "w_shape": W_SHAPE, "results": raw})


if __name__ == "__main__":
    main()
