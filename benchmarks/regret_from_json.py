"""The forward pass's estimates-only regret recomputed from a bench_dispatch
JSON (its measured tf, direct and fft times) with the choices of the profile
active in this process: compares profiles without timing again.

    TFBIGCONV_AUTOTUNE=0 python benchmarks/regret_from_json.py /tmp/dispatch.json
    TFBIGCONV_AUTOTUNE=0 TFBIGCONV_PROBE=0 python benchmarks/regret_from_json.py ...  # unscaled

Forward only: a forward choice is one contender's measured time, while a
fwd+bwd choice can mix contenders that bench_dispatch timed only whole.
"""
import argparse
import json

import numpy as np

import bench_dispatch
import tfbigconv
from tfbigconv.cost_model import profiles


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="bench_dispatch.py --json output")
    parser.add_argument("--worst", type=int, default=5, help="list this many worst cases")
    args = parser.parse_args()
    with open(args.json) as f:
        grid = json.load(f)["grid"]
    regrets = []
    for case in grid:
        g = bench_dispatch.Geometry(*case["geometry"])
        x, w = bench_dispatch.shapes(g)
        e = tfbigconv.explain(x, w, strides=g.stride, padding=g.padding,
                              data_format=g.data_format, dtype=g.dtype)
        chosen = e.chosen["forward"]
        times = {r["contender"]: r["median_s"] for r in case["results"]
                 if r["mode"] == "fwd" and r.get("median_s")}
        name = "tf" if chosen.startswith("tf") else chosen
        if name in times:
            best = min(t for c, t in times.items() if c in ("tf", "direct", "fft"))
            regrets.append((times[name] / best, case["label"], chosen))
    r = np.array([x[0] for x in regrets])
    print(f"profile: {profiles.active_source} ({profiles.how_fitted() or profiles.active_path})")
    print(f"forward, estimates only, {len(r)} geometries: regret median {np.median(r):.3f}, "
          f"90th pct {np.percentile(r, 90):.3f}, max {r.max():.2f}")
    for regret, label, chosen in sorted(regrets, reverse=True)[:args.worst]:
        print(f"  {regret:.2f} {label}: {chosen}")


if __name__ == "__main__":
    main()
