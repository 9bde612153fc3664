"""Replaces rows of the GPU calibration grids with re-measured ones.

A re-measurement (e.g. scripts/gpu_recalibrate_depthwise.sh after a kernel
changed) times a subset of the geometries. Each NEW file goes into the file of
the same name in --into; a row replaces the row with the same geometry, dtype,
pass and algorithm, in place, so the grids stay one file per dtype family and
every other row is kept as it was.

    python benchmarks/gpu_replace_rows.py OUT/gpu_*.csv --into benchmarks/gpu [--dry-run]

Refuses (exit 2, nothing written) when a file's columns differ or when a new
row has no row to replace: the grids name their geometries, and a new one
belongs in the calibration GRID or random draw first.
"""
import argparse
import csv
import os
import sys

KEY = ("N", "H", "W", "Cin", "Cout", "K", "groups", "stride", "dtype", "pass", "algo")


def read(path):
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


def replace_rows(new_path, old_path):
    """(rows of old_path with new_path's rows in place, how many replaced);
    ValueError when the columns differ or a new row matches no old row."""
    new_cols, new_rows = read(new_path)
    old_cols, old_rows = read(old_path)
    if new_cols != old_cols:
        raise ValueError(f"{new_path}: columns {new_cols} differ from {old_path}'s {old_cols}")
    index = {tuple(r[k] for k in KEY): i for i, r in enumerate(old_rows)}
    for r in new_rows:
        key = tuple(r[k] for k in KEY)
        if key not in index:
            raise ValueError(f"{new_path}: no row in {old_path} for {dict(zip(KEY, key))}")
        old_rows[index[key]] = r
    return old_cols, old_rows, len(new_rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new", nargs="+", help="re-measured grid CSV files")
    ap.add_argument("--into", required=True, help="folder of the grids to update")
    ap.add_argument("--dry-run", action="store_true", help="check and count, write nothing")
    args = ap.parse_args(argv)
    updates = []
    try:
        for path in args.new:
            old = os.path.join(args.into, os.path.basename(path))
            if not os.path.exists(old):
                raise ValueError(f"{path}: no {old} to update")
            updates.append((old,) + replace_rows(path, old))
    except ValueError as e:
        print(f"gpu_replace_rows: {e}", file=sys.stderr)
        return 2
    for old, cols, rows, count in updates:
        print(f"{old}: {count} of {len(rows)} rows replaced" + (" (dry run)" if args.dry_run else ""))
        if not args.dry_run:
            with open(old, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
