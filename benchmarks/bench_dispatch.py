"""How good is algorithm="auto"? Its time against the best of im2col (tf.nn.conv2d),
direct and fft, measured on a grid of geometries, as forward and as forward + backward.

Grid: GRID below, 44 geometries spanning filter sizes 1-135, channels 1-128
(dense and depthwise), batch 1-64, images 32-512 px and strides 1-2; float32, NHWC.

Contenders, each a tf.function:
    auto     tfbigconv.bigconv2d(..., algorithm="auto"): the trace-time dispatcher
             (im2col, direct or fft per pass), then the ops' own run-time choice
    im2col   tf.nn.conv2d (tf.nn.depthwise_conv2d's math via groups) and TF's gradients
    direct   bigconv2d(..., algorithm="direct") for every pass
    fft      bigconv2d(..., algorithm="fft") for every pass
"fwd" times y = conv(x, w); "fwd+bwd" times y and both gradients of sum(y * g)
for a fixed random g (a training step's convolution work).

Each geometry runs in its own subprocess (machinery: _harness.py). Inside it, the
contenders are measured round-robin for --rounds rounds (the machine is noisy), each
round the median of up to 5 calls within about 0.6 s after a warm-up call; the
smallest median counts; the order rotates each round. A contender whose planner
estimate exceeds --skip-s seconds is not run and shows as "skipped (est. ...)"; one
still running when the geometry's worker passes --timeout is killed, shown as
"> T s (killed)", and the geometry rerun without it. auto always runs.

Regret = auto time / best measured time of {im2col, direct, fft} on the same geometry
and mode; "vs tf" = auto time / im2col time. Targets (issue 5): regret median <= 1.05,
90th percentile <= 1.25, max <= 2; auto nowhere more than 10% slower than tf.nn.conv2d.

The seed case (200, 321, 481, 1) x (135, 135, 1, 3) VALID also runs with
workspace_limit = 256 MiB: its peak RSS increase must stay within
input + output + 256 MiB + 10%.

Usage:
    python benchmarks/bench_dispatch.py [--quick] [--rounds 2] [--out F.md] [--json F.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import _harness

MIB = 1 << 20
CONTENDERS = ("auto", "im2col", "direct", "fft")
MODES = ("fwd", "fwd+bwd")

# (batch, height, width, in channels, K, out channels, stride, depthwise, padding)
GRID = [
    (1, 32, 32, 1, 1, 1, 1, False, "SAME"),
    (8, 64, 64, 16, 1, 16, 1, False, "SAME"),
    (8, 128, 128, 128, 1, 128, 1, False, "SAME"),
    (4, 128, 128, 32, 3, 32, 1, False, "SAME"),
    (16, 64, 64, 64, 3, 64, 1, False, "SAME"),
    (2, 256, 256, 3, 3, 16, 2, False, "SAME"),
    (64, 32, 32, 32, 3, 32, 1, False, "SAME"),
    (1, 512, 512, 1, 3, 1, 1, False, "SAME"),
    (4, 64, 64, 128, 3, 128, 1, False, "SAME"),
    (8, 128, 128, 8, 5, 8, 1, False, "SAME"),
    (32, 32, 32, 16, 5, 16, 2, False, "SAME"),
    (2, 128, 128, 64, 7, 64, 1, False, "SAME"),
    (8, 128, 128, 1, 7, 3, 1, False, "SAME"),
    (4, 128, 128, 16, 7, 16, 1, False, "SAME"),
    (64, 32, 32, 3, 7, 16, 2, False, "SAME"),
    (8, 64, 64, 32, 11, 32, 1, False, "SAME"),
    (4, 256, 256, 1, 15, 3, 1, False, "SAME"),
    (2, 128, 128, 16, 15, 16, 1, False, "SAME"),
    (4, 64, 64, 64, 15, 64, 1, False, "SAME"),
    (1, 512, 512, 3, 15, 8, 2, False, "SAME"),
    (8, 56, 56, 128, 15, 128, 1, True, "SAME"),
    (64, 64, 64, 1, 15, 1, 1, False, "SAME"),
    (16, 64, 64, 8, 21, 8, 1, False, "SAME"),
    (2, 256, 256, 4, 21, 4, 2, False, "SAME"),
    (4, 128, 128, 1, 31, 3, 1, False, "SAME"),
    (2, 128, 128, 32, 31, 32, 1, False, "SAME"),
    (8, 56, 56, 128, 31, 128, 1, True, "SAME"),
    (1, 512, 512, 1, 31, 1, 1, False, "SAME"),
    (2, 256, 256, 16, 31, 16, 2, False, "SAME"),
    (4, 96, 96, 64, 31, 64, 1, False, "SAME"),
    (16, 64, 64, 4, 45, 4, 1, False, "SAME"),
    (2, 256, 256, 1, 45, 3, 1, False, "VALID"),
    (1, 256, 256, 32, 45, 32, 1, False, "SAME"),
    (4, 128, 128, 8, 63, 8, 1, False, "SAME"),
    (16, 321, 481, 1, 63, 3, 1, False, "VALID"),
    (2, 128, 128, 32, 63, 32, 2, False, "SAME"),
    (1, 512, 512, 1, 63, 1, 1, False, "SAME"),
    (8, 64, 64, 64, 63, 64, 1, True, "SAME"),
    (4, 256, 256, 3, 95, 3, 1, False, "VALID"),
    (1, 512, 512, 16, 95, 16, 1, False, "SAME"),
    (16, 321, 481, 1, 135, 3, 1, False, "VALID"),
    (2, 256, 256, 8, 135, 8, 1, False, "SAME"),
    (1, 512, 512, 1, 135, 1, 2, False, "SAME"),
    (4, 200, 200, 3, 135, 3, 1, False, "VALID"),
]
QUICK = [GRID[i] for i in (1, 3, 16, 26, 40)]


def label(g):
    n, h, w, ci, k, co, s, dw, pad = g
    ch = f"dw{ci}" if dw else f"{ci}->{co}"
    return f"{n}x{h}x{w} {ch} K={k} s={s} {pad}"


def shapes(g):
    n, h, w, ci, k, co, s, dw, pad = g
    return (n, h, w, ci), (k, k, 1 if dw else ci, co), s, pad


def build(contender, mode, x, w, g_out, stride, pad, workspace_limit=0):
    import tensorflow as tf
    import tfbigconv
    if contender == "im2col":
        conv = lambda x, w: tf.nn.conv2d(x, w, stride, pad)
    else:
        conv = lambda x, w: tfbigconv.bigconv2d(x, w, stride, pad, algorithm=contender,
                                                workspace_limit=workspace_limit)
    if mode == "fwd":
        f = tf.function(lambda x, w: conv(x, w))
        return lambda: f(x, w).numpy()

    @tf.function
    def step(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) * g_out)
        return t.gradient(loss, [x, w])
    return lambda: [v.numpy() for v in step(x, w)]


def estimate_s(e, contender, mode):
    passes = ("forward",) if mode == "fwd" else ("forward", "backprop_input", "backprop_filter")
    if contender == "auto":
        return None
    return sum(r.seconds if r.available and r.fits else float("inf")
               for r in e.rows if r.algorithm == contender and r.pass_ in passes)


def worker_geometry(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    g = spec["geometry"]
    x_shape, w_shape, stride, pad = shapes(g)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(x_shape, dtype=np.float32))
    w = tf.constant(rng.standard_normal(w_shape, dtype=np.float32))
    e = tfbigconv.explain(x_shape, w_shape, strides=stride, padding=pad)
    y_shape = e.geometry["output_shape"]
    g_out = tf.constant(rng.standard_normal(y_shape, dtype=np.float32))
    results = {}
    calls = {}
    for mode in MODES:
        for c in CONTENDERS:
            est = estimate_s(e, c, mode)
            if [c, mode] in spec["killed"]:
                results[(c, mode)] = {"killed_after_s": spec["timeout"]}
                continue
            if est is not None and est > spec["skip_s"]:
                results[(c, mode)] = {"skipped_est_s": est}
                continue
            calls[(c, mode)] = build(c, mode, x, w, g_out, stride, pad)
    medians = {key: [] for key in calls}
    keys = list(calls)
    for rnd in range(spec["rounds"]):
        # Rotate the order each round: the first contender measured after another
        # one runs in a differently warmed machine.
        for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            call = calls[key]
            if rnd > 0 and medians[key] and medians[key][0] > _harness.SLOW_CALL_S:
                continue  # too slow to repeat
            with open(spec["progress"], "w") as f:  # the parent's clue if we get killed
                json.dump(list(key), f)
            t0 = time.perf_counter()
            call()
            first = time.perf_counter() - t0
            if first > _harness.SLOW_CALL_S:
                medians[key].append(first)
                continue
            times = []
            while len(times) < 5 and (sum(times) < 0.6 or len(times) < 2):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            medians[key].append(statistics.median(times))
    for key, m in medians.items():
        results[key] = {"median_s": min(m)}
    return {"results": [{"contender": c, "mode": mode, **r} for (c, mode), r in results.items()],
            "chosen": e.chosen, "macs": e.geometry["macs"]}


def worker_seed_budget(spec):
    import numpy as np
    import tensorflow as tf
    import tfbigconv
    limit = spec["limit"]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((200, 321, 481, 1), dtype=np.float32))
    w = tf.constant(rng.standard_normal((135, 135, 1, 3), dtype=np.float32))
    f = tf.function(lambda x: tfbigconv.bigconv2d(x, w, 1, "VALID", workspace_limit=limit))
    f(x[:1]).numpy()  # warm-up (traces for batch 1; the full call retraces)
    r = _harness.measure_call(lambda: f(x).numpy(), reps=3)
    e = tfbigconv.explain((200, 321, 481, 1), (135, 135, 1, 3), padding="VALID", budget=limit)
    fft = next(row for row in e.rows if row.pass_ == "forward" and row.chosen)
    return {"median_s": r["median_s"], "rss_increase_bytes": r["rss_increase_bytes"],
            "in_bytes": 200 * 321 * 481 * 4, "out_bytes": 200 * 187 * 347 * 3 * 4,
            "limit": limit, "chosen": fft.algorithm, "plan": fft.note}


def worker(spec):
    out = worker_geometry(spec) if spec["method"] == "geometry" else worker_seed_budget(spec)
    print(json.dumps(out))


def percentile(v, q):
    v = sorted(v)
    i = (len(v) - 1) * q
    lo, hi = int(i), min(int(i) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def fmt_ms(r):
    if r is None:
        return "-"
    if "skipped_est_s" in r:
        return f"skipped (est. {r['skipped_est_s']:.0f} s)"
    if "killed_after_s" in r:
        return f"> {r['killed_after_s']:.0f} s (killed)"
    if "error" in r:
        return "error"
    return f"{1e3 * r['median_s']:.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="5 geometries, 1 round")
    p.add_argument("--only", help="run only the geometries whose label contains this")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip-s", type=float, default=30.0,
                   help="skip a forced contender whose planner estimate exceeds this")
    p.add_argument("--timeout", type=float, default=150,
                   help="per geometry worker, seconds; the contender it was running when "
                        "killed is left out and the geometry rerun")
    p.add_argument("--out", help="append the tables, with the command, to this file")
    p.add_argument("--json", help="write the raw results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    import tensorflow as tf
    grid = QUICK if args.quick else GRID
    if args.only:
        grid = [g for g in grid if args.only in label(g)]
    rounds = 1 if args.quick else args.rounds
    rows, regrets, vs_tf = [], {m: [] for m in MODES}, {m: [] for m in MODES}
    raw = []
    progress = os.path.join(_harness.HERE, f".bench_dispatch_progress_{os.getpid()}.json")
    for g in grid:
        spec = {"method": "geometry", "geometry": list(g), "rounds": rounds, "skip_s": args.skip_s,
                "killed": [], "timeout": args.timeout, "progress": progress}
        while True:  # a contender that runs past the timeout is killed and left out
            res = _harness.run_worker(__file__, spec, timeout=args.timeout)
            if "error" not in res or "timeout" not in res["error"] or not os.path.exists(progress):
                break
            with open(progress) as f:
                spec["killed"].append(json.load(f))
            print(f"{label(g)}: {spec['killed'][-1]} killed after {args.timeout:.0f} s",
                  file=sys.stderr)
        if os.path.exists(progress):
            os.remove(progress)
        raw.append({"geometry": g, "killed": spec["killed"], **res})
        if "error" in res:
            print(f"{label(g)}: {res['error']}", file=sys.stderr)
            rows.append(f"| {label(g)} | error: {res['error']} |||||||||")
            continue
        by = {(r["contender"], r["mode"]): r for r in res["results"]}
        chosen = "/".join(res["chosen"][p][:2] if res["chosen"][p] != "im2col" else "im"
                          for p in ("forward", "backprop_input", "backprop_filter"))
        cells = []
        for mode in MODES:
            auto = by.get(("auto", mode), {}).get("median_s", float("inf"))
            timed = [by[(c, mode)]["median_s"] for c in CONTENDERS[1:]
                     if "median_s" in by.get((c, mode), {})]
            best = min(timed + [auto])
            regret = auto / best
            regrets[mode].append(regret)
            tf_r = by.get(("im2col", mode), {})
            ratio = auto / tf_r["median_s"] if "median_s" in tf_r else None
            if ratio is not None:
                vs_tf[mode].append(ratio)
            cells += [fmt_ms(by.get((c, mode))) for c in CONTENDERS]
            cells += [f"{regret:.2f}", f"{ratio:.3f}" if ratio is not None else "-"]
        rows.append(f"| {label(g)} | {chosen} | " + " | ".join(cells) + " |")
        print(f"{label(g)}: {chosen} regret fwd {regrets['fwd'][-1]:.2f} "
              f"fwd+bwd {regrets['fwd+bwd'][-1]:.2f}", file=sys.stderr)

    head = ("| geometry | auto's choice (fwd/bwd-input/bwd-filter) | "
            "fwd auto ms | fwd im2col ms | fwd direct ms | fwd fft ms | fwd regret | fwd auto/tf | "
            "f+b auto ms | f+b im2col ms | f+b direct ms | f+b fft ms | f+b regret | f+b auto/tf |")
    sep = "|" + "---|" * 14
    summary = ["| mode | geometries | regret median | 90th pct | max | auto/tf max | "
               "geometries where auto > 1.1 x tf |", "|---|---|---|---|---|---|---|"]
    for mode in MODES:
        r, t = regrets[mode], vs_tf[mode]
        summary.append(f"| {mode} | {len(r)} | {statistics.median(r):.3f} | {percentile(r, 0.9):.3f} | "
                       f"{max(r):.2f} | {max(t, default=float('nan')):.2f} | {sum(v > 1.1 for v in t)} |")

    seed = _harness.run_worker(__file__, {"method": "seed_budget", "limit": 256 * MIB},
                               timeout=args.timeout)
    if "error" in seed:
        seed_line = f"Seed case with a 256 MiB budget: error {seed['error']}"
    else:
        allowed = (seed["in_bytes"] + seed["out_bytes"] + seed["limit"]) * 1.1
        seed_line = (f"Seed case (200, 321, 481, 1) x (135, 135, 1, 3) VALID, auto, "
                     f"workspace_limit 256 MiB: {seed['chosen']} ({seed['plan']}), "
                     f"{1e3 * seed['median_s']:.0f} ms, peak RSS increase "
                     f"{seed['rss_increase_bytes'] / MIB:.0f} MiB against the allowed "
                     f"(in + out + 256 MiB) x 1.1 = {allowed / MIB:.0f} MiB: "
                     f"{'met' if seed['rss_increase_bytes'] <= allowed else 'MISSED'}")
    _, _, header = _harness.run_header(tf.__version__)
    body = "\n".join(summary + ["", seed_line, "", head, sep] + rows)
    print(header + "\n\n" + body)
    if args.out:
        _harness.append_markdown(args.out, "bench_dispatch", header, body)
    if args.json:
        _harness.write_json(args.json, {"grid": raw, "seed_budget": seed})


if __name__ == "__main__":
    main()
