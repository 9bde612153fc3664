"""How good is auto's GPU choice? explain(device="GPU") on measured grids, no GPU needed.

For every geometry and dtype of the grid CSV files (scripts/gpu_check.sh
--calibrate; the H100 grids are in shared/gpu/), asks the planner
(tfbigconv.explain with device="GPU", estimates only) for each pass's
candidate among cuDNN (TF's Conv2D / DepthwiseConv2dNative), direct and fft,
and sums the MEASURED kernel times of its picks (fwd+bwd = the three passes).

    regret     = picked fwd+bwd / best per-pass fwd+bwd of {cudnn, direct, fft}
    vs cudnn   = picked fwd+bwd / cuDNN's fwd+bwd

Targets (issue 11): regret median <= 1.2, max <= 2; vs cudnn never > 1.1.

--loo refits the GPU model without the geometry being judged (leave one
geometry out), which says how the model does on geometries it has not seen.

    python benchmarks/gpu_dispatch_regret.py ../shared/gpu/h100_grid_*.csv [--loo] [--out F.md]
"""
import argparse
import collections
import math
import os
import sys

import numpy as np

import tfbigconv
from tfbigconv import _core, gpu_fit

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


def judge(table, refit_without=None, rows=None):
    results = []
    active = _core.get_cost_model()
    fields = _core.cost_model_fields()
    try:
        for (geometry, dtype), times in table.items():
            if refit_without:
                values = dict(zip(fields, active))
                values.update(gpu_fit.fit([r for r in rows if r["geometry"] != geometry]))
                _core.set_cost_model([values[n] for n in fields])
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
    ap.add_argument("--out", help="write a markdown report here")
    args = ap.parse_args()
    rows = gpu_fit.read_grid(args.grids)
    table = measured_table(rows)
    lines = [f"Command: `python {' '.join(sys.argv)}`", "",
             f"Cost model: {tfbigconv.cost_model.active_source} "
             f"({os.path.basename(tfbigconv.cost_model.active_path or 'built-in')}); "
             "picks: c = cuDNN (TF's kernel), d = direct, f = fft", ""]
    results = judge(table)
    lines += summary(results, "fitted model (in-sample)")
    if args.loo:
        loo = judge(table, refit_without=True, rows=rows)
        lines += [""] + summary(loo, "leave one geometry out")
    lines += ["", "In-sample, per case:", ""] + table_md(results)
    if args.loo:
        lines += ["", "Leave one geometry out, per case:", ""] + table_md(loo)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
