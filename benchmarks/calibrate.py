"""Calibrates the cost model on this machine and writes the profile shipped
with the package (tfbigconv/cost_model/cost_model.json in the source tree).

    python benchmarks/calibrate.py            # then reinstall the package
    python benchmarks/calibrate.py --output /tmp/profile.json

A host of another kind (another oneDNN setting or ISA) gets a CPU-only profile
beside the main one, which cost_model.profiles.shipped_for() picks where it suits:

    python benchmarks/calibrate.py --cpu-only \
        --output tfbigconv/cost_model/cost_model_cpu_<isa>_<onednn>.json

Users calibrate their own machine with `python -m tfbigconv calibrate`.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "..", "tfbigconv", "cost_model", "cost_model.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.normpath(SHIPPED))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-only", action="store_true",
                        help="leave out the GPU values (they stay the main profile's)")
    args = parser.parse_args()
    args.output = os.path.abspath(args.output)
    os.chdir(HERE)  # import the installed package, not the source tree
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(HERE)]
    from tfbigconv.cost_model import calibrate
    calibrate.calibrate(args.output, quick=args.quick, cpu_only=args.cpu_only)


if __name__ == "__main__":
    main()
