"""The CPU FFT paths against their floor and against issue 59's baselines (the floor is
defined in docs/planner.md, "The floor of an FFT pass").

Cases (float32; --quick in brackets, a smaller batch of the same shapes):

    seed_fwd   x (200, 321, 481, 1), filter (135, 135, 1, 3), VALID, forward      [N=16]
               baseline: the faster of scipy.signal.fftconvolve and oaconvolve (as
               bench_seed.oaconvolve_conv2d, scipy.fft workers = the cores); target 8x
    seed_grad  x (16, 321, 481, 1), the same filter, fwd+bwd                       [N=2]
               baseline: the pure-TF FFT (bench_seed.tf_fft_conv2d), autodiff; target 4x
    hyena      x (8, 16384, 256), filter (16384, 1, 256), CAUSAL, fwd+bwd          [N=1]
               baseline: the hand-written TF FFT (bench_conv1d.hand_written_fft); 3x
    dw21       x (2, 48, 48, 48, 64), depthwise 21^3, SAME, fwd+bwd                [N=1]
               baseline: the hand-written tf.signal.fft3d convolution
               (bench_conv3d.hand_written_fft3d); target 5x
    dw31       x (8, 56, 56, 128), depthwise 31^2 (31, 31, 1, 128), SAME, fwd+bwd  [N=2]
               baseline: tf.nn.depthwise_conv2d (the filter as (31, 31, 128, 1)); 30x

Per case, one fresh process per oneDNN setting (TF_ENABLE_ONEDNN_OPTS) runs --rounds
rounds, each timing in turn, after one warm-up call of each:

    ours      the user's step with bigconv (algorithm "auto"), as the baseline's: y, and
              for fwd+bwd both gradients of sum(y * dy) (bench _harness.build_step)
    baseline  the same step with the case's baseline
    path      the FFT passes alone (algorithm "fft"): y, and for fwd+bwd dL/dx and dL/dw
              from tape.gradient with output_gradients=dy (no loss arithmetic)
    floor     _core.fft_floor of every pass the path runs (the fused 1-D backward for
              hyena), summed: their unavoidable transforms alone, same library, sizes
              and threads (the intra-op threads). The weights' transforms count once
              in a fwd+bwd step (in its forward pass) and not in a forward alone
              (inference can keep them); dL/doutput's always count

Printed per case: min and median of each; "target ratio" = baseline / ours (median of
the per-round ratios); "floor ratio" = path / floor (same); GFLOP/s of path and floor
over the floor's transform flops (5 n log2 n per complex transform of n points, half for
real ones). seed_fwd also measures, in a process of its own, the first call's peak RSS
increase (the input is already resident) against in+out, and next to it the planned
workspace.

    python benchmarks/bench_floor.py [--cases seed_fwd,seed_grad,hyena,dw21]
        [--onednn 0,1] [--rounds 3] [--quick] [--no-rss]
(dw31, issue 59's keep-30x case, runs only when --cases names it.)
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as H  # noqa: E402

# name: (x shape, filter shape, padding, fwd+bwd, quick batch)
CASES = {
    "seed_fwd": ((200, 321, 481, 1), (135, 135, 1, 3), "VALID", False, 16),
    "seed_grad": ((16, 321, 481, 1), (135, 135, 1, 3), "VALID", True, 2),
    "hyena": ((8, 16384, 256), (16384, 1, 256), "CAUSAL", True, 1),
    "dw21": ((2, 48, 48, 48, 64), (21, 21, 21, 1, 64), "SAME", True, 1),
    "dw31": ((8, 56, 56, 128), (31, 31, 1, 128), "SAME", True, 2),
}
TARGETS = {"seed_fwd": 8.0, "seed_grad": 4.0, "hyena": 3.0, "dw21": 5.0, "dw31": 30.0}
FLOOR_TARGET = 1.3


def core_geometry(xs, ws, padding):
    """_core's geometry arguments (4-D or 5-D, as the ops pose the case)."""
    if len(xs) == 3:  # 1-D: height 1, the causal padding explicit
        k = ws[0]
        return dict(input_shape=[xs[0], 1, xs[1], xs[2]], filter_shape=[1, *ws],
                    strides=[1] * 4, padding="EXPLICIT",
                    explicit_paddings=[0, 0, 0, 0, k - 1, 0, 0, 0], data_format="NHWC",
                    dilations=[1] * 4)
    rank = len(xs)
    return dict(input_shape=list(xs), filter_shape=list(ws), strides=[1] * rank,
                padding=padding, explicit_paddings=[],
                data_format="NHWC" if rank == 4 else "NDHWC", dilations=[1] * rank)


def floor_passes(geometry, fwd_bwd):
    """The passes the FFT path runs: the forward, and the fused 1-D backward where it
    serves the case, else both gradient passes."""
    from tfbigconv import _core
    if not fwd_bwd:
        return ["forward"]
    try:
        _core.lane_backprop_plan(**geometry)
        return ["forward", "lane_backprop"]
    except ValueError:
        return ["forward", "backprop_input", "backprop_filter"]


def scipy_conv2d(x, w, method):
    """VALID correlation of NHWC numpy x with HWIO w by scipy.signal's `method`."""
    import numpy as np
    import scipy.fft
    import scipy.signal
    fn = getattr(scipy.signal, method)
    flipped = w[::-1, ::-1]
    with scipy.fft.set_workers(os.cpu_count()):
        return np.stack([fn(x, flipped[None, :, :, :, d], mode="valid", axes=(1, 2)).sum(axis=-1)
                         for d in range(w.shape[3])], axis=-1)


def convs(name):
    """(ours(x, w, algorithm), baseline(x, w) on tensors or None, scipy baselines)."""
    import tensorflow as tf
    import tfbigconv
    import bench_conv1d
    import bench_conv3d
    import bench_seed
    padding = CASES[name][2]
    if name == "dw31":
        ours = lambda x, w, alg: tfbigconv.bigconv2d(x, w, 1, padding, algorithm=alg)  # noqa: E731
        base = lambda x, w: tf.nn.depthwise_conv2d(  # noqa: E731
            x, tf.reshape(w, [w.shape[0], w.shape[1], w.shape[3], 1]), [1] * 4, padding)
    elif name.startswith("seed"):
        ours = lambda x, w, alg: tfbigconv.bigconv2d(x, w, 1, padding, algorithm=alg)  # noqa: E731
        base = None if name == "seed_fwd" else (
            lambda x, w: bench_seed.tf_fft_conv2d(x, w, padding))
    elif name == "hyena":
        ours = lambda x, w, alg: tfbigconv.bigconv1d(x, w, 1, "CAUSAL", algorithm=alg)  # noqa: E731
        base = bench_conv1d.hand_written_fft
    else:
        ours = lambda x, w, alg: tfbigconv.bigconv3d(x, w, 1, padding, algorithm=alg)  # noqa: E731
        base = lambda x, w: bench_conv3d.hand_written_fft3d(x, w, padding)  # noqa: E731
    return ours, base


def worker(spec):
    import numpy as np
    import tensorflow as tf
    from tfbigconv import _core, host

    name, rounds = spec["case"], spec["rounds"]
    xs, ws, padding, fwd_bwd, _ = CASES[name]
    xs = [spec["batch"], *xs[1:]]
    if spec.get("rss"):
        return print(json.dumps(rss_worker(xs, ws, padding)))
    rng = np.random.default_rng(0)
    xn = rng.standard_normal(xs, dtype=np.float32)
    wn = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[:-2]))).astype(np.float32)
    x, w = tf.constant(xn), tf.constant(wn)
    ours, base = convs(name)
    y_shape = ours(x[:1], w, "auto").shape
    dy = tf.constant(rng.standard_normal([xs[0], *y_shape[1:]]).astype(np.float32))

    def user_step(conv):
        if not fwd_bwd:
            f = tf.function(conv)
            return lambda: f(x, w).numpy()
        return H.build_step(conv, x, w, dy)

    @tf.function
    def path_fn(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = ours(x, w, "fft")
        return (y, *tape.gradient(y, [x, w], output_gradients=dy)) if fwd_bwd else y

    geometry = core_geometry(xs, ws, padding)
    passes = floor_passes(geometry, fwd_bwd)
    threads = host.workers()
    floors = []

    def floor():
        # A training step transforms the weights at least once: in its forward pass.
        res = [_core.fft_floor(**geometry, pass_=p, num_threads=threads,
                               count_filter=True if fwd_bwd and p == "forward" else None)
               for p in passes]
        floors.append(res)
        return sum(r.seconds for r in res)

    timed = {"ours": user_step(lambda x, w: ours(x, w, "auto")),
             "path": lambda: path_fn(x, w),
             "floor": floor}
    if base is not None:
        timed["baseline"] = user_step(base)
    else:  # the faster scipy method, each timed (numpy in, numpy out)
        for method in ("fftconvolve", "oaconvolve"):
            timed[method] = lambda m=method: scipy_conv2d(xn, wn, m)
    seconds = {k: [] for k in timed}
    for call in timed.values():  # warm-up: tracing, plans, autotuning
        call()
    for _ in range(rounds):
        for k, call in timed.items():
            t0 = time.perf_counter()
            r = call()
            elapsed = time.perf_counter() - t0
            seconds[k].append(r if k == "floor" else elapsed)
            del r
    if base is None:
        seconds["baseline"] = [min(a, b) for a, b in zip(seconds["fftconvolve"], seconds["oaconvolve"])]
    last = floors[-1]
    print(json.dumps({
        "case": name, "x": xs, "w": list(ws), "seconds": seconds, "passes": passes,
        "floor_flops": sum(r.flops for r in last),
        "floor_transforms": sum(r.transforms for r in last),
        "plans": [fields(r.plan) for r in last], "threads": threads,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")}))


def fields(plan):
    """A _core plan's fields, for JSON."""
    return {k: getattr(plan, k) for k in dir(plan) if not k.startswith("_")}


def rss_worker(xs, ws, padding):
    """The first call's peak RSS increase of the FFT forward, the input resident."""
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    from tfbigconv import _core, host
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(xs, dtype=np.float32))
    w = tf.constant(rng.standard_normal(ws, dtype=np.float32))
    call = lambda: tfbigconv.bigconv2d(x, w, 1, padding, algorithm="fft")  # noqa: E731
    np.asarray(tfbigconv.bigconv2d(x[:1, :8, :8], w[:3, :3], 1, padding, algorithm="fft"))
    m = H.measure_call(call, 1)
    plan = _core.fft_plan(**core_geometry(xs, ws, padding), workers=host.workers())
    out = call().shape.num_elements() * 4
    return {"rss_increase_bytes": m["rss_increase_bytes"], "in_bytes": int(np.prod(xs)) * 4,
            "out_bytes": out, "workspace_bytes": plan.workspace_bytes}


def ratio_stats(num, den):
    r = [a / b for a, b in zip(num, den)]
    return min(r), statistics.median(r), max(r)


def row(res):
    s = res["seconds"]
    ms = lambda v: f"{1e3 * min(v):.1f} / {1e3 * statistics.median(v):.1f}"  # noqa: E731
    tgt = ratio_stats(s["baseline"], s["ours"])
    flo = ratio_stats(s["path"], s["floor"])
    gf = lambda t: res["floor_flops"] / statistics.median(t) / 1e9  # noqa: E731
    name = res["case"]
    return (f"| {name} {tuple(res['x'])}x{tuple(res['w'])} | {res['onednn']} | "
            f"{ms(s['ours'])} | {ms(s['baseline'])} | **{tgt[1]:.2f}x** ({tgt[0]:.2f}-{tgt[2]:.2f}) "
            f"vs {TARGETS[name]:g}x | {ms(s['path'])} | {ms(s['floor'])} | "
            f"**{flo[1]:.2f}x** ({flo[0]:.2f}-{flo[2]:.2f}) | {gf(s['path']):.1f} / {gf(s['floor']):.1f} |"
            f" {'+'.join(res['passes'])} |")


HEADER = ["| case | oneDNN | ours ms (min / median) | baseline ms | target ratio "
          "(baseline / ours: median of rounds, range) | FFT path ms | floor ms | floor ratio "
          "(path / floor) | GFLOP/s path / floor | passes |",
          "|---|---|---|---|---|---|---|---|---|---|"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="seed_fwd,seed_grad,hyena,dw21")
    ap.add_argument("--onednn", default="0,1", help="TF_ENABLE_ONEDNN_OPTS values, one process each")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the quick batch of each case, 2 rounds")
    ap.add_argument("--no-rss", action="store_true", help="skip seed_fwd's RSS process")
    ap.add_argument("--json", help="write the results here")
    args = H.parse_args_or_work(ap, worker)
    rounds = 2 if args.quick else args.rounds
    results, rss = [], None
    for name in args.cases.split(","):
        if name not in CASES:
            sys.exit(f"--cases: unknown case {name!r}; the cases are {', '.join(CASES)}")
        batch = CASES[name][4] if args.quick else CASES[name][0][0]
        for onednn in args.onednn.split(","):
            os.environ["TF_ENABLE_ONEDNN_OPTS"] = onednn
            res = H.run_worker(__file__, {"case": name, "rounds": rounds, "batch": batch})
            if "error" in res:
                print(f"  {name} oneDNN={onednn}: {res['error']}", file=sys.stderr)
                continue
            results.append(res)
            print("  " + row(res), file=sys.stderr)
        if name == "seed_fwd" and not args.no_rss:
            rss = H.run_worker(__file__, {"case": name, "rounds": 0, "batch": batch, "rss": True})
    import tensorflow as tf
    _, _, header = H.run_header(tf.__version__, f", {os.cpu_count()} threads shared")
    print(header)
    print()
    print("\n".join(HEADER + [row(r) for r in results]))
    if rss and "error" not in rss:
        mib = lambda b: b / H.MIB  # noqa: E731
        io = rss["in_bytes"] + rss["out_bytes"]
        print(f"\nseed_fwd RSS (oneDNN {os.environ.get('TF_ENABLE_ONEDNN_OPTS')}): first call's peak "
              f"increase {mib(rss['rss_increase_bytes']):.1f} MiB = {rss['rss_increase_bytes'] / io:.2f}x "
              f"in+out ({mib(io):.1f} MiB); in + increase = "
              f"{(rss['in_bytes'] + rss['rss_increase_bytes']) / io:.2f}x in+out; output "
              f"{mib(rss['out_bytes']):.1f} + planned workspace {mib(rss['workspace_bytes']):.1f} MiB")
    elif rss:
        print(f"seed_fwd RSS: {rss['error']}")
    if args.json:
        H.write_json(args.json, {"results": results, "rss": rss})


if __name__ == "__main__":
    main()
