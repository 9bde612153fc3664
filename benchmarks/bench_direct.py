"""Benchmark bigconv2d(algorithm="direct") against tf.nn.conv2d: forward, float32, NHWC, SAME.

Grid (square K x K filters, stride 1, no dilation):

    K in {3, 7, 15, 31, 63}            (--quick: K in {7, 31}; --ks overrides both)
    Cin/Cout  input (N, H, W, Cin)     filter (K, K, Cin, Cout)
    1/3       (4, 321, 321, 1)         an image filter bank, like docs/ARCHITECTURE.md section 1
    16/16     (4, 128, 128, 16)
    64/64     (2, 128, 128, 64)        the largest point: tf.nn.conv2d takes about 3 s at K=63

Each (point, method) runs in a fresh subprocess (this script with --worker). The worker
builds its inputs from numpy's default_rng(0), turns them into tf constants,
warms the TF runtime up on a tiny convolution, resets the peak RSS to the current RSS
(/proc/self/clear_refs) and reads ru_maxrss as the baseline; the first real call's peak
RSS increase over it is the method's memory (its output plus any workspace). Then it times
`--reps` calls (default 5; 3 at most when a call takes over 2 s). The machine is noisy, so
each (point, method) runs in `--rounds` subprocesses (default 2, interleaved with the other
method) and the smallest median counts. The machinery is shared with the other benchmark
scripts in _harness.py. The table gives the peak RSS increase in MiB, and the part of it
beyond the output's own bytes as a percentage of the bytes of input + output + filter
(the memory target: under 5%).

The machine's float32 peak is the best of 3 numpy 4096x4096 float32 matmuls, measured
in its own subprocess with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its
environment (they slow OpenBLAS down here). "% of peak" is the direct kernel's GFLOP/s
(2 * MACs / median time) over that peak.

Usage:
    python benchmarks/bench_direct.py [--quick] [--ks 7,31] [--reps 5]
                                      [--out benchmarks/RESULTS.md] [--json results.json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

KS = (3, 7, 15, 31, 63)
QUICK_KS = (7, 31)
# (Cin, Cout) -> input shape (N, H, W, Cin)
SHAPES = {
    (1, 3): (4, 321, 321, 1),
    (16, 16): (4, 128, 128, 16),
    (64, 64): (2, 128, 128, 64),
}
METHODS = ("direct", "tf")
MIB = _harness.MIB


def worker(spec):
    """Runs one (point, method) in this process and prints its result as one JSON line."""
    import numpy as np
    import tensorflow as tf
    import tfbigconv

    in_shape, f_shape = spec["input_shape"], spec["filter_shape"]
    geometry = tfbigconv._core.conv_geometry(
        in_shape, f_shape, [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1])
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(in_shape, dtype=np.float32))
    w = tf.constant(rng.standard_normal(f_shape, dtype=np.float32))
    def conv_with(x, w):
        if spec["method"] == "direct":
            return tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm="direct")
        return tf.nn.conv2d(x, w, 1, "SAME")

    # Warm up the TF runtime on a tiny case, so that the first real call's
    # peak RSS is the method's own memory: its output plus any workspace.
    conv_with(x[:1, :8, :8], w[:3, :3]).numpy()
    m = _harness.measure_call(lambda: conv_with(x, w), spec["reps"])

    out_shape = geometry.output_shape
    io_bytes = 4 * sum(int(np.prod(s)) for s in (in_shape, f_shape, out_shape))
    print(json.dumps({
        "median_s": m["median_s"],
        "times_s": m["times_s"],
        "warmup_s": m["warmup_s"],
        "reps": m["reps"],
        "macs": geometry.macs,
        "output_shape": out_shape,
        "io_bytes": io_bytes,
        "baseline_maxrss_bytes": m["baseline_maxrss_bytes"],
        "rss_increase_bytes": m["rss_increase_bytes"],
        "tf_version": tf.__version__,
    }))


def fmt_rss(result):
    """Peak RSS increase in MiB, and what it holds beyond the output as a % of in+out+filter."""
    mib = result["rss_increase_bytes"] / MIB
    out_bytes = 4 * int(__import__("numpy").prod(result["output_shape"]))
    beyond = 100 * (result["rss_increase_bytes"] - out_bytes) / result["io_bytes"]
    return f"{mib:.1f} ({beyond:+.1f}%)"


def table(rows, peak):
    lines = [
        "| Cin/Cout | K | input shape | direct ms | tf ms | speedup (tf/direct) | direct GF/s "
        "| % of peak | direct RSS +MiB (beyond output, % of in+out+filter) | tf RSS +MiB (same) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        d, t = row["direct"], row["tf"]
        cells = [f"{row['cin']}/{row['cout']}", str(row["k"]),
                 "x".join(map(str, row["input_shape"]))]
        cells.append(f"{1e3 * d['median_s']:.1f}" if "error" not in d else f"error: {d['error']}")
        cells.append(f"{1e3 * t['median_s']:.1f}" if "error" not in t else f"error: {t['error']}")
        if "error" not in d and "error" not in t:
            cells.append(f"{t['median_s'] / d['median_s']:.2f}x")
        else:
            cells.append("-")
        if "error" not in d:
            gflops = 2 * d["macs"] / d["median_s"] / 1e9
            cells += [f"{gflops:.1f}", f"{100 * gflops / peak:.0f}%", fmt_rss(d)]
        else:
            cells += ["-", "-", "-"]
        cells.append(fmt_rss(t) if "error" not in t else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"K in {QUICK_KS} only")
    p.add_argument("--ks", help="comma-separated filter sizes, e.g. 7,31 (overrides --quick)")
    p.add_argument("--reps", type=int, default=5, help="timed calls per point (default 5)")
    p.add_argument("--rounds", type=int, default=2,
                   help="subprocesses per (point, method); the smallest median counts")
    p.add_argument("--out", help="append the table, with the command and machine, to this file")
    p.add_argument("--json", help="write the raw results to this JSON file")
    return _harness.parse_args_or_work(p, worker)


def main():
    args = parse_args()
    if args.ks:
        ks = [int(k) for k in args.ks.split(",")]
    else:
        ks = QUICK_KS if args.quick else KS

    peak_runs = _harness.measure_peak_gflops()
    peak = max(peak_runs)
    print(f"numpy float32 matmul peak (4096x4096, best of 3): {peak:.1f} GFLOP/s "
          f"(runs: {', '.join(f'{v:.0f}' for v in peak_runs)})", file=sys.stderr)

    rows = []
    for (cin, cout), in_shape in SHAPES.items():
        for k in ks:
            row = {"cin": cin, "cout": cout, "k": k, "input_shape": list(in_shape),
                   "filter_shape": [k, k, cin, cout]}
            specs = {method: {"method": method, "input_shape": row["input_shape"],
                              "filter_shape": row["filter_shape"], "reps": args.reps}
                     for method in METHODS}
            row.update(_harness.best_of_rounds(__file__, specs, args.rounds,
                                               f"{cin}/{cout} K={k}"))
            rows.append(row)

    tf_version = next((row[m]["tf_version"] for row in rows for m in METHODS
                       if "tf_version" in row[m]), "unknown")
    command, date, header = _harness.run_header(
        tf_version, f", numpy float32 matmul peak {peak:.1f} GFLOP/s")
    body = table(rows, peak)
    _harness.publish(args, "bench_direct", header, body, {
        "command": command, "date": date, "tf_version": tf_version,
        "cpu": _harness.cpu_model(), "cpu_count": os.cpu_count(),
        "peak_gflops": peak, "peak_gflops_runs": peak_runs, "results": rows})


if __name__ == "__main__":
    main()
