"""Where the GPU time of a few target cases goes (issue 41), without TensorFlow.

1. The FFT chunk sweep: the fft pass timed with workspace limits from 16 MiB
   to 4 GiB. The planner takes the largest chunk of (image, tile) items that
   fits the limit (up to 1 GiB of spectra), so the limit sets the chunk: this
   says whether chunks whose spectra stay in L2 (50 MB on an H100) beat one
   chunk through HBM.
2. A kernel breakdown: every CUDA kernel of one call (ours, cuFFT's), from
   torch.profiler (CUPTI sees every kernel of the process), summed by name.

Run through scripts/gpu_measure.sh (or with PYTHONPATH=build/gpu_harness:tests
after scripts/gpu_check.sh built the harness). Prints a report; --csv F writes
the sweep's rows.
"""
import argparse
import collections
import csv
import sys

import check_kernels as K

# (label, input NHWC or NDHWC, filter HWIO or DHWIO, padding (or explicit
# paddings, a list), dtype, passes)
CASES = [
    ("seed N=200 135^2", (200, 321, 481, 1), (135, 135, 1, 3), "VALID", "float32", ["forward"]),
    ("depthwise (8,56,56,128) 31^2", (8, 56, 56, 128), (31, 31, 1, 128), "SAME", "float32",
     K.PASSES),
    ("dense (4,128,128,32) 31^2 f16", (4, 128, 128, 32), (31, 31, 32, 32), "SAME", "float16",
     K.PASSES),
    ("dense (32,64,64,64) 15^2", (32, 64, 64, 64), (15, 15, 64, 64), "SAME", "float32",
     ["backprop_filter"]),
]
# issue 41's 1-D and 3-D cases (--ranks)
RANK_CASES = [
    ("1-D causal depthwise (8,16384,256) 16384 taps", (8, 1, 16384, 256), (1, 16384, 1, 256),
     [0, 0, 0, 0, 16383, 0, 0, 0], "float32", K.PASSES),
    ("3-D depthwise (2,48,48,48,64) 21^3", (2, 48, 48, 48, 64), (21, 21, 21, 1, 64), "SAME",
     "float32", K.PASSES),
]


def ours(torch, xs, ws, padding, dtype):
    if isinstance(padding, list):
        return K.Ours(torch, xs, ws, stride=[1] * (len(xs) - 2), padding="EXPLICIT", dtype=dtype,
                      explicit_paddings=padding)
    return K.Ours(torch, xs, ws, stride=[1] * (len(xs) - 2), padding=padding, dtype=dtype)
LIMITS_MIB = [16, 32, 64, 128, 256, 512, 1024, 4096]


def sweep(torch, writer, cases):
    print("\n== fft chunk sweep: kernel ms (CUDA events, median of 5) by workspace limit ==")
    print(f"{'case':32s} {'pass':16s} " + " ".join(f"{m:>8d}M" for m in LIMITS_MIB))
    for label, xs, ws, padding, dtype, passes in cases:
        o = ours(torch, xs, ws, padding, dtype)
        for pass_ in passes:
            row = []
            for mib in LIMITS_MIB:
                try:
                    r = o.time(pass_, "fft", reps=5, workspace_limit=mib << 20)
                    ms, used = r["kernel_ms"], r["workspace_bytes"]
                except Exception as e:  # no plan fits this limit
                    ms, used = float("nan"), str(e).split(";")[0]
                row.append(ms)
                if writer:
                    writer.writerow([label, pass_, dtype, mib, f"{ms:.4f}", used])
            print(f"{label:32s} {pass_:16s} " + " ".join(f"{v:9.3f}" for v in row), flush=True)
        del o
        torch.cuda.empty_cache()


def breakdown(torch, cases, algos):
    from torch.profiler import ProfilerActivity, profile
    print("\n== kernel breakdown of one call (default workspace), us per kernel name ==")
    for label, xs, ws, padding, dtype, passes in cases:
        o = ours(torch, xs, ws, padding, dtype)
        for pass_, algo in [(p, a) for p in passes for a in algos]:
            try:
                o.time(pass_, algo, reps=1)  # plans, warms up
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    r = o.time(pass_, algo, reps=1)
                    torch.cuda.synchronize()
            except Exception as e:
                print(f"{label} {pass_} {algo}: {e}")
                continue
            total = collections.Counter()
            count = collections.Counter()
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    total[ev.name[:70]] += ev.time_range.elapsed_us()
                    count[ev.name[:70]] += 1
            # the timed call ran three times (warm-up, timed, wall): per call
            print(f"-- {label} {pass_} {algo}: kernel {r['kernel_ms']:.3f} ms "
                  f"({r['algorithm']}: {r['reason'][:90]})")
            for name, us in total.most_common(8):
                print(f"   {us / 3:10.1f} us  x{count[name] // 3:<4d} {name}")
        del o
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", help="write the sweep's rows here")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--ranks", action="store_true", help="the 1-D and 3-D cases instead")
    ap.add_argument("--only", help="the cases whose label holds this")
    ap.add_argument("--algos", default="fft,direct", help="breakdown algorithms")
    args = ap.parse_args()
    cases = [c for c in (RANK_CASES if args.ranks else CASES)
             if args.only is None or args.only in c[0]]
    K.load_shipped_cost_model()
    be = K.pick_backend()
    if be.name != "torch":
        sys.exit("profile_kernels needs torch")
    torch = be.torch
    print("GPU:", torch.cuda.get_device_name(0))
    f = open(args.csv, "w", newline="") if args.csv else None
    w = csv.writer(f) if f else None
    if w:
        w.writerow(["case", "pass", "dtype", "limit_mib", "kernel_ms", "workspace_bytes"])
    if not args.no_sweep:
        sweep(torch, w, cases)
    if f:
        f.close()
    if not args.no_breakdown:
        breakdown(torch, cases, args.algos.split(","))


if __name__ == "__main__":
    main()
