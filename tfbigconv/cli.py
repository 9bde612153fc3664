"""Command line: python -m tfbigconv {explain,calibrate,fit-gpu,memory} ...

  python -m tfbigconv explain --input 200,321,481,1 --filter 135,135,1,3 --padding VALID
  python -m tfbigconv explain ... --device GPU   # the GPU's candidates and cost model
  python -m tfbigconv explain --input 8,16384,256 --filter 16384,1,256 --padding CAUSAL  # 1-D
  python -m tfbigconv calibrate            # this machine's CPU profile, into the user's cache
  python -m tfbigconv fit-gpu GRID.csv ... # the GPU section from scripts/gpu_check.sh --calibrate
  python -m tfbigconv memory MODEL.keras --batch 16 [--budget 8G] [--device GPU] [--plot m.png]
"""
import argparse
import os
import re
import sys

import keras
import tensorflow as tf

import tfbigconv
from tfbigconv.cost_model import calibrate, gpu_fit, profiles
from tfbigconv.memory.plot import image_format

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _ints(text):
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def _bytes(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 268435456, 256M or 2G, got {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def _padding(text):
    if text.upper() in ("SAME", "VALID", "CAUSAL"):
        return text.upper()
    v = _ints(text)
    if len(v) not in (6, 8, 10):
        raise argparse.ArgumentTypeError("explicit padding takes 8 ints (4 (before, after) "
                                         "pairs), 6 for a 1-D input or 10 for a 3-D one")
    return [v[i:i + 2] for i in range(0, len(v), 2)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tfbigconv")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="the planner's table for a convolution")
    ex.add_argument("--input", type=_ints, required=True,
                    help="input shape, e.g. 200,321,481,1 (3 ints: 1-D, e.g. 8,16384,256; "
                    "5 ints: 3-D)")
    ex.add_argument("--filter", type=_ints, required=True,
                    help="filter shape HWIO, e.g. 135,135,1,3 (1-D: WIO, e.g. 16384,1,256; "
                    "3-D: DHWIO)")
    ex.add_argument("--strides", type=_ints, default=[1])
    ex.add_argument("--padding", type=_padding, default="VALID",
                    help="SAME, VALID, CAUSAL (1-D), or 8 explicit ints (6 for 1-D, 10 for 3-D)")
    ex.add_argument("--dilations", type=_ints, default=[1])
    ex.add_argument("--data-format", default="NHWC",
                    choices=["NHWC", "NCHW", "NWC", "NCW", "NDHWC", "NCDHW"])
    ex.add_argument("--dtype", default="float32",
                    choices=["float16", "bfloat16", "float32", "float64"])
    ex.add_argument("--budget", type=_bytes, default=None,
                    help="workspace budget (default: half of the free memory)")
    ex.add_argument("--algorithm", default="auto")
    ex.add_argument("--device", default="CPU", choices=["CPU", "GPU"])
    ex.add_argument("--autotune", action="store_true",
                    help="time the candidates auto would time (default: estimates and cache)")
    cal = sub.add_parser("calibrate", help="measure this machine and store its cost model")
    cal.add_argument("--output", default=None, help="profile path (default: the user's cache)")
    cal.add_argument("--quick", action="store_true", help="tiny problems (tests only)")
    cal.add_argument("--budget", type=float, default=calibrate.BUDGET_S,
                     help="seconds the measurements may take (default %(default)g; 0: no "
                     "limit): each is taken once, again while time is left")
    fit = sub.add_parser("fit-gpu", help="fit the GPU cost model to measured grid CSV files")
    fit.add_argument("grids", nargs="+", help="CSV files of scripts/gpu_check.sh --calibrate")
    fit.add_argument("--output", default=None,
                     help="profile to update (default: the user's; created from the active one)")
    mem = sub.add_parser("memory", help="where a model's training step keeps its memory")
    mem.add_argument("model", help="a saved Keras model (.keras)")
    mem.add_argument("--batch", type=int, required=True, help="batch size")
    mem.add_argument("--budget", type=_bytes, default=None,
                     help="memory budget for the largest-batch advice (default: free memory)")
    mem.add_argument("--device", default=None, choices=["CPU", "GPU"],
                     help="default: a visible GPU, else the CPU")
    mem.add_argument("--inference", action="store_true", help="forward pass only")
    mem.add_argument("--plot", default=None, metavar="PATH",
                     help="also draw live memory over the step into PATH (.png or .svg; "
                     "needs matplotlib)")
    args = parser.parse_args(argv)

    try:
        if args.command == "explain":
            print(tfbigconv.explain(args.input, args.filter, strides=args.strides,
                                    padding=args.padding, data_format=args.data_format,
                                    dilations=args.dilations, dtype=args.dtype,
                                    budget=args.budget, algorithm=args.algorithm,
                                    device=args.device, autotune=args.autotune))
        elif args.command == "memory":
            if args.batch < 1:
                print("error: --batch must be a positive int", file=sys.stderr)
                return 2
            if args.plot is not None:
                try:
                    image_format(args.plot)  # before the report, not after
                except ValueError as e:
                    print(f"error: --plot: {e}", file=sys.stderr)
                    return 2
            model = keras.models.load_model(args.model, compile=True)
            report = tfbigconv.memory_report(model, args.batch, training=not args.inference,
                                             device=args.device, budget=args.budget)
            print(report)
            if args.plot is not None:
                try:
                    report.plot(args.plot)
                except ImportError as e:
                    print(f"error: --plot: {e}", file=sys.stderr)
                    return 2
                print(f"Plot: {args.plot}")
        elif args.command == "calibrate":
            output = args.output or profiles.user_path()
            _check_writable(output)  # before the measuring, not after
            calibrate.calibrate(output, quick=args.quick, budget_s=args.budget or None)
        else:
            output = args.output or profiles.user_path()
            rows = gpu_fit.read_grid(args.grids)
            if not rows:
                print("error: no cudnn/direct/fft rows in the grid files", file=sys.stderr)
                return 2
            profiles.update_profile(output, gpu_fit.fit(rows),
                                      {"gpu_grids": [os.path.basename(p) for p in args.grids]})
            print(f"fitted the GPU model to {len(rows)} timings; wrote {output}")
    except (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError) as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _check_writable(path):
    """Raises OSError if a profile cannot be written at `path` (as write_profile writes it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    probe = path + ".tmp"
    with open(probe, "w"):
        pass
    os.remove(probe)
