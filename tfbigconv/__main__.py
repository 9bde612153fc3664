"""Command line: python -m tfbigconv {explain,calibrate} ...

  python -m tfbigconv explain --input 200,321,481,1 --filter 135,135,1,3 --padding VALID
  python -m tfbigconv calibrate            # this machine's profile, into the user's cache
"""
import argparse
import re
import sys

import tensorflow as tf

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _ints(text):
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}")


def _bytes(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a size like 268435456, 256M or 2G, got {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def _padding(text):
    if text.upper() in ("SAME", "VALID"):
        return text.upper()
    v = _ints(text)
    if len(v) != 8:
        raise argparse.ArgumentTypeError("explicit padding takes 8 ints: 4 (before, after) pairs")
    return [v[i:i + 2] for i in range(0, 8, 2)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tfbigconv")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="the planner's table for a convolution")
    ex.add_argument("--input", type=_ints, required=True, help="input shape, e.g. 200,321,481,1")
    ex.add_argument("--filter", type=_ints, required=True, help="filter shape HWIO, e.g. 135,135,1,3")
    ex.add_argument("--strides", type=_ints, default=[1])
    ex.add_argument("--padding", type=_padding, default="VALID",
                    help="SAME, VALID, or 8 explicit ints")
    ex.add_argument("--dilations", type=_ints, default=[1])
    ex.add_argument("--data-format", default="NHWC", choices=["NHWC", "NCHW"])
    ex.add_argument("--dtype", default="float32",
                    choices=["float16", "bfloat16", "float32", "float64"])
    ex.add_argument("--budget", type=_bytes, default=None,
                    help="workspace budget (default: half of the free memory)")
    ex.add_argument("--algorithm", default="auto")
    cal = sub.add_parser("calibrate", help="measure this machine and store its cost model")
    cal.add_argument("--output", default=None, help="profile path (default: the user's cache)")
    cal.add_argument("--quick", action="store_true", help="tiny problems (tests only)")
    args = parser.parse_args(argv)

    import tfbigconv
    from tfbigconv import calibrate, cost_model

    try:
        if args.command == "explain":
            print(tfbigconv.explain(args.input, args.filter, strides=args.strides,
                                    padding=args.padding, data_format=args.data_format,
                                    dilations=args.dilations, dtype=args.dtype,
                                    budget=args.budget, algorithm=args.algorithm))
        else:
            calibrate.calibrate(args.output or cost_model.user_path(), quick=args.quick)
    except (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError) as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
