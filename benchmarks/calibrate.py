"""Calibrates the cost model on this machine and writes the profile shipped
with the package (tfbigconv/cost_model.json in the source tree).

    python benchmarks/calibrate.py            # then reinstall the package
    python benchmarks/calibrate.py --output /tmp/profile.json

Users calibrate their own machine with `python -m tfbigconv calibrate`.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(HERE, "..", "tfbigconv", "cost_model.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.normpath(SHIPPED))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.chdir(HERE)  # import the installed package, not the source tree
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(HERE)]
    from tfbigconv import calibrate
    calibrate.calibrate(args.output, quick=args.quick)


if __name__ == "__main__":
    main()
