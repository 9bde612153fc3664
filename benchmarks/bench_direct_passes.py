"""The CPU direct kernel pass by pass, and the cost model's estimate.

Sets (--set; NHWC float32, SAME):
  depthwise  filters (K, K, 1, C), as in MobileNet/ConvNeXt/RepLKNet layers (the groups
             kernel); until 2026-11-23 this script was bench_direct_depthwise.py
  dense      small and large dense filters: 1x1, 3x3, 7x7 (the chans kernel), 15x15,
             a 31x31 one-to-three-channel image filter (the cols kernel), and a 3x3
             layer on 7x7 maps (narrow outputs)

For each pass the direct kernel runs through `_core.run_pass` (TF's ops are not
involved: this times the kernel and its threading, 2 workers here) on inputs from
numpy's default_rng; the best of --reps calls after one warm-up counts. The estimate is
the planner's (planner.plan, the active profile) for direct on the same pass; "est/meas"
near 1 means the model knows the kernel.

Every output of the first case of each stride in the set is checked against the float64
NumPy reference (tests/reference.py) by relative L2 before anything is timed.

Run it with another build's interpreter, or with PYTHONPATH pointing at another build's
installed package (from outside the repository, so that an installed package is
imported), to compare two builds:

    python benchmarks/bench_direct_passes.py [--set depthwise|dense|all] [--reps 5] [--quick]
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# (input NHWC, filter HWIO, stride)
SETS = {
    "depthwise": [((8, 112, 112, 32), (3, 3, 1, 32), 1), ((8, 112, 112, 32), (3, 3, 1, 32), 2),
                  ((8, 112, 112, 32), (7, 7, 1, 32), 2), ((64, 32, 32, 32), (3, 3, 1, 32), 1),
                  ((16, 160, 160, 64), (3, 3, 1, 64), 1), ((8, 56, 56, 128), (7, 7, 1, 128), 1),
                  ((8, 56, 56, 128), (13, 13, 1, 128), 1),
                  ((8, 56, 56, 128), (31, 31, 1, 128), 1),
                  ((16, 28, 28, 256), (13, 13, 1, 256), 1)],
    "dense": [((8, 112, 112, 32), (1, 1, 32, 32), 1), ((8, 56, 56, 64), (3, 3, 64, 64), 1),
              ((16, 28, 28, 128), (3, 3, 128, 128), 1), ((8, 56, 56, 64), (3, 3, 64, 64), 2),
              ((4, 128, 128, 16), (7, 7, 16, 16), 1), ((4, 64, 64, 32), (15, 15, 32, 32), 1),
              ((4, 321, 321, 1), (31, 31, 1, 3), 1), ((32, 7, 7, 256), (3, 3, 256, 256), 1)],
}
QUICK = {"depthwise": [0, 1, 5], "dense": [0, 1, 5]}
PASSES = ("forward", "backprop_input", "backprop_filter")
CHECK_TOL = 1e-5  # float32 against float64, relative L2


def best_ms(call, reps):
    call()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--set", choices=["depthwise", "dense", "all"], default="depthwise")
    args = ap.parse_args()
    from tfbigconv import _core
    from tfbigconv.planning import planner
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import reference

    print(f"tfbigconv from {os.path.dirname(_core.__file__)}")
    print("| input | filter | stride | pass | direct ms | estimate ms | est/meas |")
    print("|---|---|---|---|---|---|---|")
    sets = ["depthwise", "dense"] if args.set == "all" else [args.set]
    cases = [(name, c) for name in sets for i, c in enumerate(SETS[name])
             if not args.quick or i in QUICK[name]]
    checked = set()
    for name, (shape, w_shape, s) in cases:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        st = [1, s, s, 1]
        attrs = dict(strides=st, padding="SAME", explicit_paddings=[], data_format="NHWC",
                     dilations=[1] * 4)
        geo = _core.conv_geometry(list(shape), list(w.shape), st, "SAME", [], "NHWC", [1] * 4)
        dy = rng.standard_normal(geo.output_shape).astype(np.float32)
        outs = {"forward": np.empty(geo.output_shape, np.float32),
                "backprop_input": np.empty(shape, np.float32),
                "backprop_filter": np.empty(w.shape, np.float32)}
        calls = {
            "forward": lambda: _core.run_pass("direct", "forward", x, w, [], st, "SAME", [],
                                              "NHWC", [1] * 4, out=outs["forward"]),
            "backprop_input": lambda: _core.run_pass(
                "direct", "backprop_input", dy, w, list(shape), st, "SAME", [], "NHWC",
                [1] * 4, out=outs["backprop_input"]),
            "backprop_filter": lambda: _core.run_pass(
                "direct", "backprop_filter", x, dy, list(w.shape), st, "SAME", [], "NHWC",
                [1] * 4, out=outs["backprop_filter"]),
        }
        if (name, s) not in checked:  # one case per set and stride against float64
            checked.add((name, s))
            kw = dict(strides=(s, s), padding="SAME")
            refs = {"forward": lambda: reference.conv2d_reference(x, w, **kw),
                    "backprop_input": lambda: reference.conv2d_reference_backprop_input(
                        dy, w, shape, **kw),
                    "backprop_filter": lambda: reference.conv2d_reference_backprop_filter(
                        x, dy, w.shape, **kw)}
            for p in PASSES:
                calls[p]()
                ref = refs[p]()
                err = np.linalg.norm(outs[p] - ref) / np.linalg.norm(ref)
                if not err <= CHECK_TOL:
                    sys.exit(f"{shape}x{w_shape} s={s} {p}: rel L2 {err:.3g} > {CHECK_TOL}")
        for p in PASSES:
            ms = best_ms(calls[p], args.reps)
            est = planner.plan(p, list(shape), list(w.shape), attrs, "float32", "auto",
                               1 << 30).direct.seconds * 1e3
            print(f"| {shape} | {w_shape} | {s} | {p} | {ms:.1f} | {est:.1f} | {est / ms:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
