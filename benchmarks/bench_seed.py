"""The motivating case, docs/ARCHITECTURE.md section 1: bigconv2d(algorithm="fft") against
tf.nn.conv2d, an FFT convolution in pure TF and scipy.signal.oaconvolve. Forward, float32, NHWC.

Sections (--quick in brackets):

    seed    input (200, 321, 481, 1), filter (135, 135, 1, 3), VALID     [N=16]
            tf.nn.conv2d takes about 0.1 s per image here, so it runs at N=16 and its
            time is scaled linearly to N=200 (marked "scaled"); --full runs it at N=200.
    sweep   input (16, 321, 481, 1), filter (K, K, 1, 3), VALID,
            K in {5, 15, 31, 63, 135}                                     [K in {15, 135}]
            bigconv2d(algorithm="direct") runs here too; time and memory vs K go to --plot.
    dense   input (4, 128, 128, 32), filter (31, 31, 32, 32), SAME        [N=1]
            all five contenders; oaconvolve takes about 0.7 s per image here, so it stays.

Contenders, each (point, contender) in fresh subprocesses (the machinery is _harness.py,
shared with bench_direct.py): warm-up on a tiny case, the first real call's peak RSS
increase, the median of --reps timed calls, the best median of --rounds subprocesses
(interleaved with the other contenders).

    bigconv2d fft     tfbigconv.bigconv2d(x, w, 1, padding, algorithm="fft")
    bigconv2d direct  tfbigconv.bigconv2d(x, w, 1, padding, algorithm="direct")
    tf.nn.conv2d      tf.nn.conv2d(x, w, 1, padding)
    pure-TF FFT       tf_fft_conv2d below: whole-image rfft2d, einsum, irfft2d, crop
    scipy oaconvolve  oaconvolve_conv2d below: per output channel over the batch, summed
                      over input channels; scipy.fft may use all cores (set_workers)

"peak RSS / (in+out)" is the peak RSS increase over the bytes of the input and the output
of that run (a method that needs nothing beyond its output scores out/(in+out)).
"bigconv2d fft speedup" is the contender's time over bigconv2d fft's, both from this run.
"rel L2" is ||y0 - ref|| / ||ref|| for the first output image y0 against a float64 numpy
FFT convolution of the first input image, computed in the worker after the measurement.
Before measuring, a self-check compares tf_fft_conv2d, oaconvolve_conv2d and the float64
reference with tf.nn.conv2d on small odd shapes (VALID and SAME) and stops if any is off
by more than 1e-5.

Usage:
    python benchmarks/bench_seed.py [--quick] [--full] [--reps 5] [--rounds 2 (--quick: 1)]
        [--plot benchmarks/seed_sweep.png] [--out benchmarks/RESULTS.md] [--json seed.json]
    python benchmarks/bench_seed.py --self-check
"""
import argparse
import importlib.metadata
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

METHODS = {
    "fft": "bigconv2d fft",
    "direct": "bigconv2d direct",
    "tf": "tf.nn.conv2d",
    "tf_fft": "pure-TF FFT",
    "oaconvolve": "scipy oaconvolve",
}
SEED_N, QUICK_SEED_N, TF_SEED_N = 200, 16, 16
SEED_IMAGE = (321, 481)
SEED_FILTER = (135, 135, 1, 3)
SWEEP_N = 16
SWEEP_KS, QUICK_SWEEP_KS = (5, 15, 31, 63, 135), (15, 135)
DENSE_N, QUICK_DENSE_N = 4, 1
DENSE_IMAGE = (128, 128, 32)
DENSE_FILTER = (31, 31, 32, 32)
SELF_CHECK_CASES = [  # (input shape, filter shape, padding)
    ((2, 17, 23, 2), (5, 4, 2, 3), "VALID"),
    ((2, 17, 23, 2), (5, 4, 2, 3), "SAME"),
    ((1, 16, 15, 3), (6, 7, 3, 2), "SAME"),
]
DEFAULT_PLOT = os.path.join(_harness.HERE, "seed_sweep.png")


def same_pads(kh, kw):
    """tf.nn.conv2d's SAME padding at stride 1: [[top, bottom], [left, right]]."""
    return [[(kh - 1) // 2, kh // 2], [(kw - 1) // 2, kw // 2]]


def tf_padded_rfft2d(x, kh, kw, padding):
    """(xf, h, wd): x (NHWC) zero-padded as SAME pads it at stride 1 for a kh x kw filter
    (VALID: as it is), its height and width then, and its rfft2d over them, channels
    first (N, C, h, wd/2+1)."""
    import tensorflow as tf
    if padding == "SAME":
        x = tf.pad(x, [[0, 0], *same_pads(kh, kw), [0, 0]])
    h, wd = x.shape[1], x.shape[2]
    return tf.signal.rfft2d(tf.transpose(x, [0, 3, 1, 2])), h, wd


def tf_fft_conv2d(x, w, padding):
    """FFT convolution in plain TF, the way a user would write it with tf.signal."""
    import tensorflow as tf
    kh, kw = w.shape[0], w.shape[1]
    xf, h, wd = tf_padded_rfft2d(x, kh, kw, padding)                       # N, Cin, H, W/2+1
    # Correlation is convolution with the flipped filter.
    wf = tf.signal.rfft2d(tf.transpose(w[::-1, ::-1], [2, 3, 0, 1]), [h, wd])  # Cin, Cout, ...
    y = tf.signal.irfft2d(tf.einsum("nchw,cdhw->ndhw", xf, wf), [h, wd])
    # Circular convolution wraps only into the first K-1 rows and columns: drop them.
    return tf.transpose(y[:, :, kh - 1:, kw - 1:], [0, 2, 3, 1])


def oaconvolve_conv2d(x, w, padding):
    """The same with scipy.signal.oaconvolve (numpy arrays, NHWC)."""
    import numpy as np
    import scipy.fft
    import scipy.signal
    kh, kw = w.shape[0], w.shape[1]
    if padding == "SAME":
        x = np.pad(x, [(0, 0), *same_pads(kh, kw), (0, 0)])
    flipped = w[::-1, ::-1]
    with scipy.fft.set_workers(os.cpu_count()):
        return np.stack([
            scipy.signal.oaconvolve(x, flipped[None, :, :, :, d], mode="valid",
                                    axes=(1, 2)).sum(axis=-1)
            for d in range(w.shape[3])], axis=-1)


def reference(x, w, padding):
    """float64 FFT correlation in numpy: the correctness reference."""
    import numpy as np
    kh, kw = w.shape[0], w.shape[1]
    if padding == "SAME":
        x = np.pad(x, [(0, 0), *same_pads(kh, kw), (0, 0)])
    h, wd = x.shape[1], x.shape[2]
    xf = np.fft.rfft2(x.astype(np.float64), axes=(1, 2))
    wf = np.fft.rfft2(w[::-1, ::-1].astype(np.float64), (h, wd), axes=(0, 1))
    y = np.fft.irfft2(np.einsum("nhwc,hwcd->nhwd", xf, wf), (h, wd), axes=(1, 2))
    return y[:, kh - 1:, kw - 1:]


def contender(method, x, w, padding):
    """A function of no arguments that convolves x with w (numpy float32, NHWC) by method."""
    if method == "oaconvolve":
        return lambda: oaconvolve_conv2d(x, w, padding)
    import tensorflow as tf
    import tfbigconv
    xt, wt = tf.constant(x), tf.constant(w)
    if method == "tf":
        return lambda: tf.nn.conv2d(xt, wt, 1, padding)
    if method == "tf_fft":
        return lambda: tf_fft_conv2d(xt, wt, padding)
    return lambda: tfbigconv.bigconv2d(xt, wt, 1, padding, algorithm=method)


rel_l2 = _harness.rel_l2


def self_check():
    """Relative L2 errors of the hand-written convolutions against tf.nn.conv2d."""
    import numpy as np

    def case_errors(x, w, padding):
        ref = np.asarray(contender("tf", x, w, padding)())
        errors = {m: rel_l2(np.asarray(contender(m, x, w, padding)()), ref)
                  for m in ("tf_fft", "oaconvolve")}
        errors["float64 reference"] = rel_l2(reference(x, w, padding), ref)
        return errors
    return _harness.self_check_cases(SELF_CHECK_CASES, case_errors)


def worker(spec):
    """Runs one (point, method) in this process and prints its result as one JSON line."""
    if spec["method"] == "self_check":
        print(json.dumps({"cases": self_check()}))
        return
    import numpy as np

    method, padding = spec["method"], spec["padding"]
    in_shape, f_shape = spec["input_shape"], spec["filter_shape"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(in_shape, dtype=np.float32)
    w = rng.standard_normal(f_shape, dtype=np.float32)
    x0 = x[:1].copy()
    call = contender(method, x, w, padding)
    del x
    # Warm up on a tiny case, so that the first real call's peak RSS is the
    # method's own memory: its output plus any workspace.
    np.asarray(contender(method, x0[:, :8, :8], w[:3, :3], padding)())
    m = _harness.measure_call(call, spec["reps"], keep=lambda y: np.array(y[0]))

    first_image = m.pop("kept")
    ref = reference(x0, w, padding)[0]
    out_shape = [in_shape[0], *ref.shape]
    result = {
        "method": method, "input_shape": in_shape, "filter_shape": f_shape,
        "padding": padding, "output_shape": out_shape,
        "in_out_bytes": 4 * (int(np.prod(in_shape)) + int(np.prod(out_shape))),
        "rel_l2": rel_l2(first_image, ref), **m,
    }
    if method == "oaconvolve":
        import scipy
        result["versions"] = {"scipy": scipy.__version__, "numpy": np.__version__}
    else:
        import tensorflow as tf
        import tfbigconv
        from tfbigconv import host
        result["versions"] = {"tensorflow": tf.__version__, "numpy": np.__version__}
        if method == "fft":
            # The op plans with the intra-op pool's threads as its workers.
            plan = tfbigconv._core.fft_plan(
                in_shape, f_shape, [1, 1, 1, 1], padding, [], "NHWC", [1, 1, 1, 1],
                workers=host.workers())
            result["fft_plan"] = {k: getattr(plan, k) for k in (
                "tile_h", "tile_w", "fft_h", "fft_w", "tiles_h", "tiles_w", "chunk", "items",
                "workspace_bytes")}
    print(json.dumps(result))


class Runner:
    """Measures {method: spec} sets, best of rounds; identical specs are measured once."""

    def __init__(self, rounds, reps):
        self.rounds, self.reps, self.done = rounds, reps, {}

    def measure(self, label, points):
        """points: {method: (input shape, filter shape, padding)} -> {method: result}."""
        specs = {m: {"method": m, "input_shape": list(i), "filter_shape": list(f),
                     "padding": p, "reps": self.reps} for m, (i, f, p) in points.items()}
        todo = {m: s for m, s in specs.items() if spec_key(s) not in self.done}
        for m in specs:
            if m not in todo:
                print(f"  {label} {m}: measured above, reused", file=sys.stderr)
        best = _harness.best_of_rounds(__file__, todo, self.rounds, label)
        self.done.update({spec_key(todo[m]): res for m, res in best.items()})
        return {m: self.done[spec_key(s)] for m, s in specs.items()}


def spec_key(spec):
    return json.dumps(spec, sort_keys=True)


def point(name, n, results, **extra):
    """A table point: results at their own batch sizes, reported at batch n."""
    return {"name": name, "n": n, "results": results, **extra}


def scaled_s(res, n):
    """The result's median time scaled linearly from its own batch to n images."""
    return res["median_s"] * n / res["input_shape"][0]


def table(points):
    lines = [
        "| point | contender | N run | median ms at N | per image ms | peak RSS +MiB (at N run) "
        "| peak RSS / (in+out) | bigconv2d fft speedup | rel L2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pt in points:
        n, fft = pt["n"], pt["results"].get("fft", {})
        for method, res in pt["results"].items():
            cells = [f"{pt['name']}, N={n}", METHODS[method]]
            if "error" in res:
                lines.append("| " + " | ".join(cells + [f"error: {res['error']}"]
                                               + ["-"] * 6) + " |")
                continue
            n_run = res["input_shape"][0]
            cells.append(str(n_run) if n_run == n else f"{n_run} (time scaled)")
            cells.append(f"{1e3 * scaled_s(res, n):.1f}" + (" (scaled)" if n_run != n else ""))
            cells.append(f"{1e3 * res['median_s'] / n_run:.2f}")
            cells.append(f"{res['rss_increase_bytes'] / _harness.MIB:.1f}")
            cells.append(f"{res['rss_increase_bytes'] / res['in_out_bytes']:.2f}")
            if method == "fft" or "error" in fft:
                cells.append("-")
            else:
                cells.append(f"{scaled_s(res, n) / scaled_s(fft, n):.2f}x")
            cells.append(f"{res['rel_l2']:.1e}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fft_plan_note(points):
    notes = []
    for pt in points:
        plan = pt["results"].get("fft", {}).get("fft_plan")
        if plan:
            notes.append(
                f"- {pt['name']}, N={pt['n']}: bigconv2d fft plan: tile {plan['tile_h']}x"
                f"{plan['tile_w']} (FFT {plan['fft_h']}x{plan['fft_w']}, "
                f"{plan['tiles_h']}x{plan['tiles_w']} tiles), chunk {plan['chunk']} of "
                f"{plan['items']} items, "
                f"workspace {plan['workspace_bytes'] / _harness.MIB:.1f} MiB")
    return "\n".join(notes)


def plot(sweep_points, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method, label in METHODS.items():
        pts = [(pt["k"], pt["results"][method]) for pt in sweep_points
               if "error" not in pt["results"].get(method, {"error": "absent"})]
        if not pts:
            continue
        ks = [k for k, _ in pts]
        ax_t.plot(ks, [1e3 * r["median_s"] for _, r in pts], "o-", label=label)
        ax_m.plot(ks, [r["rss_increase_bytes"] / _harness.MIB for _, r in pts], "o-", label=label)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_m, "peak RSS increase (MiB)")):
        ax.set_xlabel("filter size K (K x K x 1 x 3)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_xticks([pt["k"] for pt in sweep_points], [str(pt["k"]) for pt in sweep_points])
        ax.minorticks_off()
    ax_t.set_yscale("log")
    ax_t.legend(fontsize=8)
    fig.suptitle(f"input ({SWEEP_N}, {SEED_IMAGE[0]}, {SEED_IMAGE[1]}, 1) float32, VALID, "
                 "forward")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"seed at N={QUICK_SEED_N}, K in {QUICK_SWEEP_KS}, "
                        f"dense at N={QUICK_DENSE_N}")
    p.add_argument("--full", action="store_true",
                   help="run tf.nn.conv2d on the whole seed batch instead of scaling from "
                        f"N={TF_SEED_N}")
    p.add_argument("--reps", type=int, default=5, help="timed calls per point (default 5)")
    p.add_argument("--rounds", type=int,
                   help="subprocesses per (point, contender); the smallest median counts "
                        "(default 2; 1 with --quick)")
    p.add_argument("--plot", default=DEFAULT_PLOT,
                   help="PNG of the sweep's time and memory vs K ('' for none)")
    p.add_argument("--out", help="append the tables, with the command and machine, to this file")
    p.add_argument("--json", help="write the raw results to this JSON file")
    p.add_argument("--self-check", action="store_true",
                   help="only check the hand-written contenders against tf.nn.conv2d")
    return _harness.parse_args_or_work(p, worker)


def main():
    args = parse_args()
    checks = _harness.run_self_check(__file__, "tf.nn.conv2d", then_exit=args.self_check)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    runner = Runner(args.rounds, args.reps)

    seed_n = QUICK_SEED_N if args.quick else SEED_N
    tf_n = seed_n if args.full else min(TF_SEED_N, seed_n)
    seed_in = (seed_n, *SEED_IMAGE, 1)
    seed = runner.measure(f"seed N={seed_n}", {
        "fft": (seed_in, SEED_FILTER, "VALID"),
        "tf": ((tf_n, *SEED_IMAGE, 1), SEED_FILTER, "VALID"),
        "tf_fft": (seed_in, SEED_FILTER, "VALID"),
        "oaconvolve": (seed_in, SEED_FILTER, "VALID"),
    })
    seed_points = [point("seed K=135", seed_n, seed)]

    sweep_points = []
    for k in QUICK_SWEEP_KS if args.quick else SWEEP_KS:
        f_shape = (k, k, 1, 3)
        points = {m: ((SWEEP_N, *SEED_IMAGE, 1), f_shape, "VALID") for m in METHODS}
        sweep_points.append(point(f"K={k}", SWEEP_N, runner.measure(f"sweep K={k}", points),
                                  k=k))

    dense_n = QUICK_DENSE_N if args.quick else DENSE_N
    dense_in = (dense_n, *DENSE_IMAGE)
    dense = runner.measure(f"dense N={dense_n}",
                           {m: (dense_in, DENSE_FILTER, "SAME") for m in METHODS})
    dense_points = [point("dense 31x31x32x32", dense_n, dense)]

    results = [res for pt in seed_points + sweep_points + dense_points
               for res in pt["results"].values()]
    versions = {}
    for res in results:
        versions.update(res.get("versions", {}))
    versions.setdefault("tensorflow", "unknown")
    versions.setdefault("scipy", importlib.metadata.version("scipy"))
    command, date, header = _harness.run_header(
        versions["tensorflow"], f", scipy {versions['scipy']}, numpy {versions.get('numpy')}")

    tf_note = ("" if tf_n == seed_n else
               f"tf.nn.conv2d ran at N={tf_n}; its time at N={seed_n} is scaled linearly "
               "(per image ms is what it measured). ")
    sections = [
        (f"Seed case: input ({seed_n}, 321, 481, 1), filter (135, 135, 1, 3), VALID",
         seed_points, tf_note),
        (f"Sweep: input ({SWEEP_N}, 321, 481, 1), filter (K, K, 1, 3), VALID",
         sweep_points, ""),
        (f"Dense: input ({dense_n}, 128, 128, 32), filter (31, 31, 32, 32), SAME",
         dense_points, ""),
    ]
    body = "\n\n".join(
        f"**{title}**\n\n{note}Times: the best median of {args.rounds} round(s).\n\n"
        f"{table(pts)}\n\n{fft_plan_note(pts)}" for title, pts, note in sections)
    if args.plot:
        plot(sweep_points, args.plot)
        body += f"\n\nSweep plot: {args.plot}"
    _harness.publish(args, "bench_seed", header, body, {
        "command": command, "date": date, "versions": versions,
        "cpu": _harness.cpu_model(), "cpu_count": os.cpu_count(), "self_check": checks,
        "seed": seed_points, "sweep": sweep_points, "dense": dense_points})


if __name__ == "__main__":
    main()
