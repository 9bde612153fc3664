#!/bin/bash
# A/B of the workers of bench_seed, bench_grad, bench_conv1d and bench_conv3d,
# alternating two builds of the package, each call a fresh process:
#   benchmarks/ab_workers.sh OLD_PKG_DIR NEW_PKG_DIR [ROUNDS]
# Each PKG_DIR holds a built tfbigconv/ (the package's .py files plus its two .so
# files from that commit's cmake build, e.g. symlinked from build/temp.*); it goes
# first on PYTHONPATH. Prints one line per build and round (median ms, RSS MiB).
set -e
OLD=${1:?usage: $0 OLD_PKG_DIR NEW_PKG_DIR [ROUNDS]}
NEW=${2:?usage: $0 OLD_PKG_DIR NEW_PKG_DIR [ROUNDS]}
ROUNDS=${3:-3}
B=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
SEED='{"method": "fft", "padding": "VALID", "input_shape": [200, 321, 481, 1], "filter_shape": [135, 135, 1, 3], "reps": 5}'
DW='{"method": "fft", "input_shape": [8, 56, 56, 128], "filter_shape": [31, 31, 1, 128], "padding": "SAME", "reps": 5, "timeout_s": 300}'
SG='{"method": "fft", "input_shape": [16, 321, 481, 1], "filter_shape": [135, 135, 1, 3], "padding": "VALID", "reps": 3, "timeout_s": 300}'
HY='{"x": [8, 16384, 256], "w": [16384, 1, 256], "method": "ours", "pass": "fwd+bwd", "reps": 3, "min_time": 2.0}'
D3='{"x": [2, 48, 48, 48, 64], "w": [21, 21, 21, 1, 64], "padding": "SAME", "method": "ours", "pass": "fwd+bwd", "reps": 3, "budget_s": 40}'
DN='{"x": [2, 32, 64, 64, 16], "w": [15, 15, 15, 16, 16], "padding": "SAME", "method": "ours", "pass": "fwd+bwd", "reps": 3, "budget_s": 40}'
ms() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read().splitlines()[-1]); print(round(1e3*d['median_s'],1), 'ms', round(d.get('rss_increase_bytes', 0)/2**20,1), 'MiB')"; }
run() { (cd "$B" && TF_CPP_MIN_LOG_LEVEL=3 PYTHONPATH=$1 "$PY" "$2" --worker "$3" 2>/dev/null | ms); }
for i in $(seq "$ROUNDS"); do
  for pkg in old new; do
    dir=$OLD; [ $pkg = new ] && dir=$NEW
    echo "$pkg: seed forward $(run "$dir" bench_seed.py "$SEED")" \
         "| grad depthwise31 $(run "$dir" bench_grad.py "$DW")" \
         "| grad seed16 $(run "$dir" bench_grad.py "$SG")" \
         "| conv1d hyena $(run "$dir" bench_conv1d.py "$HY")" \
         "| conv3d depthwise21 $(run "$dir" bench_conv3d.py "$D3")" \
         "| conv3d dense15 $(run "$dir" bench_conv3d.py "$DN")"
  done
done
