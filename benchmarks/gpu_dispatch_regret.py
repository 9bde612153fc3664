"""How good is auto's GPU choice? explain(device="GPU") on measured grids, no GPU needed.

For every geometry and dtype of the grid CSV files (scripts/gpu_check.sh
--calibrate; the H100 grids are in benchmarks/gpu/), asks the planner
(tfbigconv.explain with device="GPU", estimates only) for each pass's
candidate among cuDNN (TF's Conv2D / DepthwiseConv2dNative), direct and fft,
and sums the MEASURED kernel times of its picks (fwd+bwd = the three passes).

    regret     = picked fwd+bwd / best per-pass fwd+bwd of {cudnn, direct, fft}
    vs cudnn   = picked fwd+bwd / cuDNN's fwd+bwd

Targets (issue 11): regret median <= 1.2, max <= 2; vs cudnn never > 1.1.

--loo refits the GPU model without the geometry being judged (leave one
geometry out), which says how the model does on geometries it has not seen.
--holdout GRID.csv judges the fitted model on grids it was not fitted to
(benchmarks/gpu/gpu_random_*.csv: geometries drawn like user layers).

--tf-margin M [M ...] also judges a what-if rule: TF's kernel unless ours is
estimated M x faster (the shipped planner is M = 1), to show what a safety
margin in favour of cuDNN buys and costs.

--errors also prints the model's rms error (natural log of estimate over
measured time) per candidate, pass and dtype class, in sample: how far apart
two candidates' estimates must be before the order can be trusted.

--autotune also judges auto with measured autotuning as it runs under TF on
a GPU: per pass, the candidates autotune.candidates_to_time() would time
(the same rule as on the CPU), of which the measured fastest wins (TF's
kernel unless ours is autotune.TF_MARGIN x faster). It uses
the grid's full-batch times, so it leaves out autotuning's reduced-batch
timing error: a bound on what the rule can reach, not a measurement of it.

    python benchmarks/gpu_dispatch_regret.py benchmarks/gpu/gpu_grid_*.csv [--loo] [--autotune]
        [--holdout benchmarks/gpu/gpu_random_*.csv] [--out F.md]
"""
import argparse
import collections
import math
import os
import sys

import numpy as np

import tfbigconv
from tfbigconv import _core
from tfbigconv.cost_model import gpu_fit, profiles
from tfbigconv.planning import autotune, planner

PASSES = gpu_fit.PASSES
ALGOS = ("cudnn", "direct", "fft")
ROW_TO_ALGO = {"direct": "direct", "fft": "fft"}  # explain rows: tf.* is cudnn


def measured_table(rows):
    """{(geometry, dtype): {(pass, algo): seconds}} (missing direct timings: inf)."""
    t = collections.OrderedDict()
    for r in rows:
        t.setdefault((r["geometry"], r["dtype"]), {})[(r["pass_"], r["algo"])] = r["seconds"]
    return t


def picks(geometry, dtype):
    x, f, strides = gpu_fit.shapes(geometry)
    e = tfbigconv.explain(x, f, strides=strides[1:3], padding="SAME", dtype=dtype, device="GPU",
                          budget=64 << 30)
    return {p: ROW_TO_ALGO.get(e.chosen[p], "cudnn") for p in PASSES}


ATTRS = dict(padding="SAME", explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1])
PLAN_TO_ALGO = {"tf": "cudnn", "direct": "direct", "fft": "fft"}


def gpu_plans(geometry, dtype):
    """{pass: the GPU planner's plan} for a grid geometry (estimates only)."""
    x, f, strides = gpu_fit.shapes(geometry)
    return {p: planner.plan(p, x, f, dict(ATTRS, strides=strides), dtype, "auto", 64 << 30, "GPU")
            for p in PASSES}


def autotuned_picks(geometry, dtype, times):
    """Per pass: autotuning's measured winner (autotune.fastest) of the
    candidates it would time (the estimate's pick where it would time none)."""
    out = {}
    for p, plan in gpu_plans(geometry, dtype).items():
        names = autotune.candidates_to_time(plan) or [plan.chosen]
        out[p] = PLAN_TO_ALGO[autotune.fastest(
            {n: times.get((p, PLAN_TO_ALGO[n]), math.inf) for n in names})]
    return out


def margin_picks(geometry, dtype, margin):
    """Per pass: TF's kernel unless our best candidate is estimated `margin` x
    faster (margin 1 is the planner's own rule; a what-if, not shipped)."""
    out = {}
    for p, plan in gpu_plans(geometry, dtype).items():
        ours = min((n for n in ("direct", "fft") if plan.estimate(n).fits),
                   key=lambda n: plan.estimate(n).seconds)
        tf_ok = plan.tf.available and plan.tf.fits and plan.tf_trusted
        pick = "tf" if tf_ok and plan.tf.seconds <= margin * plan.estimate(ours).seconds else ours
        out[p] = PLAN_TO_ALGO[pick]
    return out


def judge(table, refit_without=None, rows=None, autotuned=False, margin=None):
    results = []
    active = _core.get_cost_model()
    fields = _core.cost_model_fields()
    try:
        for (geometry, dtype), times in table.items():
            if refit_without:
                values = dict(zip(fields, active))
                values.update(gpu_fit.fit([r for r in rows if r["geometry"] != geometry]))
                _core.set_cost_model([values[n] for n in fields])
            if autotuned:
                chosen = autotuned_picks(geometry, dtype, times)
            elif margin is not None:
                chosen = margin_picks(geometry, dtype, margin)
            else:
                chosen = picks(geometry, dtype)
            t = lambda p, a: times.get((p, a), math.inf)  # noqa: E731
            picked = sum(t(p, chosen[p]) for p in PASSES)
            best = sum(min(t(p, a) for a in ALGOS) for p in PASSES)
            cudnn = sum(t(p, "cudnn") for p in PASSES)
            results.append(dict(geometry=geometry, dtype=dtype, picks="".join(chosen[p][0] for p in PASSES),
                                regret=picked / best, vs_cudnn=picked / cudnn, picked_ms=picked * 1e3,
                                best_ms=best * 1e3, cudnn_ms=cudnn * 1e3))
    finally:
        _core.set_cost_model(active)
    return results


def model_errors(rows):
    """Markdown rows: rms log(estimate / measured) per (candidate, pass, dtype class)."""
    values = dict(zip(_core.cost_model_fields(), _core.get_cost_model()))
    errors = collections.defaultdict(list)
    for r in rows:
        c = gpu_fit.CANDIDATES[r["algo"]]
        est = gpu_fit.predict(values, r["geometry"], r["pass_"], c, r["dtype"])
        errors[(r["algo"], r["pass_"], gpu_fit.DTYPE_CLASSES[r["dtype"]])].append(
            math.log(est / r["seconds"]))
    out = ["| candidate | pass | dtype class | timings | rms log error | as a factor |",
           "|---|---|---|---|---|---|"]
    for (algo, p, cls), e in sorted(errors.items()):
        rms = math.sqrt(np.mean(np.square(e)))
        out.append(f"| {algo} | {p} | {cls} | {len(e)} | {rms:.2f} | {math.exp(rms):.2f}x |")
    return out


def summary(results, label):
    r = np.array([x["regret"] for x in results])
    v = np.array([x["vs_cudnn"] for x in results])
    worse = [x for x in results if x["vs_cudnn"] > 1.1]
    lines = [f"**{label}**: {len(results)} (geometry, dtype) cases; regret median {np.median(r):.3f}, "
             f"90th percentile {np.percentile(r, 90):.3f}, max {r.max():.3f}; "
             f"> 1.1x cuDNN on {len(worse)}; geometric mean speed-up over cuDNN "
             f"{math.exp(-np.mean(np.log(v))):.2f}x"]
    return lines


def table_md(results):
    out = ["| N,H,W,Cin,Cout,K,groups,stride | dtype | picks (fwd,bpi,bpf) | picked ms | best ms | cuDNN ms | regret | vs cuDNN |",
           "|---|---|---|---|---|---|---|---|"]
    for x in results:
        out.append(f"| {','.join(map(str, x['geometry']))} | {x['dtype']} | {x['picks']} | "
                   f"{x['picked_ms']:.3g} | {x['best_ms']:.3g} | {x['cudnn_ms']:.3g} | "
                   f"{x['regret']:.2f} | {x['vs_cudnn']:.2f} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grids", nargs="+")
    ap.add_argument("--loo", action="store_true", help="also judge leave-one-geometry-out refits")
    ap.add_argument("--autotune", action="store_true",
                    help="also judge auto with measured autotuning (see the docstring)")
    ap.add_argument("--holdout", nargs="+", default=[],
                    help="grids judged but not fitted to (the model as it is active)")
    ap.add_argument("--tf-margin", type=float, nargs="+", default=[],
                    help="what-if: also judge picking TF's kernel unless ours is estimated "
                         "M x faster, for each M given (in-sample, leave one out with --loo, "
                         "and held out)")
    ap.add_argument("--errors", action="store_true",
                    help="also print the model's rms error per candidate, pass and dtype class")
    ap.add_argument("--out", help="write a markdown report here")
    args = ap.parse_args()
    rows = gpu_fit.read_grid(args.grids)
    table = measured_table(rows)
    lines = [f"Command: `python {' '.join(sys.argv)}`", "",
             f"Cost model: {profiles.active_source} "
             f"({os.path.basename(profiles.active_path or 'built-in')}); "
             "picks: c = cuDNN (TF's kernel), d = direct, f = fft", ""]
    results = judge(table)
    lines += summary(results, "fitted model (in-sample)")
    sections = []
    if args.loo:
        sections.append(("leave one geometry out", judge(table, refit_without=True, rows=rows)))
    if args.holdout:
        held = measured_table(gpu_fit.read_grid(args.holdout))
        sections.append(("held out (not fitted to)", judge(held)))
    for m in args.tf_margin:
        sections.append((f"TF's kernel unless ours is estimated {m:g}x faster, in-sample",
                         judge(table, margin=m)))
        if args.loo:
            sections.append((f"TF's kernel unless ours is estimated {m:g}x faster, leave one out",
                             judge(table, refit_without=True, rows=rows, margin=m)))
        if args.holdout:
            sections.append((f"TF's kernel unless ours is estimated {m:g}x faster, held out",
                             judge(held, margin=m)))
    if args.autotune:
        sections.append(("autotuned, in-sample", judge(table, autotuned=True)))
        if args.holdout:
            sections.append(("autotuned, held out", judge(held, autotuned=True)))
    for label, res in sections:
        lines += [""] + summary(res, label)
    if args.errors:
        lines += ["", "The model's errors, in sample:", ""] + model_errors(rows)
    lines += ["", "In-sample, per case:", ""] + table_md(results)
    for label, res in sections:
        lines += ["", f"{label[0].upper()}{label[1:]}, per case:", ""] + table_md(res)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
