"""Which CPU fft plans a planner change moves: dump the plans of one install, then compare two dumps.

Plans algorithm="fft" for every pass of a grid of float32 NHWC SAME geometries
(batch 1-200, sides 28-321, 1-128 channels, K 7-135, dense and depthwise,
stride 1-2) under three workspace limits (the default budget, 64 MiB, 8 MiB),
and records each plan's estimated seconds, workspace bytes and tiling. No
kernel runs. Compare prints the plans that changed, the ratios of estimated
time and workspace, and their medians.

    python benchmarks/fft_plan_diff.py dump /tmp/before.json   # with the old install
    python benchmarks/fft_plan_diff.py dump /tmp/after.json    # with the new install
    python benchmarks/fft_plan_diff.py compare /tmp/before.json /tmp/after.json
"""
import itertools
import json
import statistics
import sys

PASSES = ("forward", "backprop_input", "backprop_filter")
LIMITS = (0, 64 << 20, 8 << 20)  # 0: the default budget


def geometries():
    out = []
    for n, h, c, cout, k, depthwise, s in itertools.product(
            (1, 8, 32, 200), (28, 64, 161, 321), (1, 16, 64, 128), (3, 64), (7, 15, 31, 63, 135),
            (False, True), (1, 2)):
        if k > 2 * h:
            continue
        groups, cout = (c, c) if depthwise else (1, cout)
        out.append((n, h, h + 37, c, cout, k, groups, s))
    return out


def dump(path):
    from tfbigconv.planning import planner
    plans = {}
    for limit in LIMITS:
        for g in geometries():
            n, h, w, c, cout, k, groups, s = g
            attrs = dict(strides=[1, s, s, 1], padding="SAME", explicit_paddings=[],
                         data_format="NHWC", dilations=[1, 1, 1, 1])
            for p in PASSES:
                key = f"{g}|{p}|{limit}"
                try:
                    f = planner.plan(p, [n, h, w, c], [k, k, c // groups, cout], attrs,
                                     "float32", "fft", limit).fft
                except Exception as e:  # noqa: BLE001 - recorded, compared like a plan
                    plans[key] = type(e).__name__
                    continue
                plans[key] = [f.seconds, f.workspace_bytes, f.note]
    with open(path, "w") as out:
        json.dump(plans, out)
    print(f"{len(plans)} planned passes -> {path}")


def compare(before_path, after_path):
    with open(before_path) as f:
        a = json.load(f)
    with open(after_path) as f:
        b = json.load(f)
    changed = [k for k in a if a[k] != b.get(k)]
    print(f"{len(changed)} of {len(a)} planned passes changed")
    ratios = []
    for k in changed:
        if isinstance(a[k], str) or isinstance(b.get(k), str):
            print(f"  {k}: {a[k]} -> {b.get(k)}")
            continue
        ratios.append((b[k][0] / a[k][0], b[k][1] / a[k][1], k))
    if not ratios:
        return
    ratios.sort()
    print(f"estimated time after/before: median {statistics.median(r[0] for r in ratios):.3f}, "
          f"min {ratios[0][0]:.3f}, max {max(r[0] for r in ratios):.3f}")
    print(f"workspace after/before: median {statistics.median(r[1] for r in ratios):.3f}, "
          f"min {min(r[1] for r in ratios):.3f}, max {max(r[1] for r in ratios):.3f}")
    print("largest time changes:")
    for t, ws, k in ratios[:8]:
        print(f"  time x{t:.3f} workspace x{ws:.2f}  {k}: {a[k][2]} -> {b[k][2]}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
