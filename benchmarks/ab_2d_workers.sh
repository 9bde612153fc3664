#!/bin/bash
# A/B of the 2-D FFT workers of bench_grad (depthwise 31x31, seed N=16, fwd+bwd)
# and bench_seed (seed forward, N=200), alternating an older build of the
# package with the installed one, each call a fresh process.
#   benchmarks/ab_2d_workers.sh OLD_PKG_DIR [ROUNDS]
# OLD_PKG_DIR holds a built tfbigconv/ (the package's .py files plus its two .so
# files from that commit's cmake build); it goes first on PYTHONPATH.
set -e
OLD=${1:?usage: $0 OLD_PKG_DIR [ROUNDS]}
ROUNDS=${2:-3}
B=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
DW='{"method": "fft", "input_shape": [8, 56, 56, 128], "filter_shape": [31, 31, 1, 128], "padding": "SAME", "reps": 5, "timeout_s": 300}'
SG='{"method": "fft", "input_shape": [16, 321, 481, 1], "filter_shape": [135, 135, 1, 3], "padding": "VALID", "reps": 3, "timeout_s": 300}'
SF='{"method": "fft", "padding": "VALID", "input_shape": [200, 321, 481, 1], "filter_shape": [135, 135, 1, 3], "reps": 5}'
ms() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read().splitlines()[-1]); print(round(1e3*d['median_s'],1), 'ms', round(d.get('rss_increase_bytes', 0)/2**20,1), 'MiB')"; }
for i in $(seq "$ROUNDS"); do
  for pkg in old new; do
    if [ $pkg = old ]; then export PYTHONPATH=$OLD; else unset PYTHONPATH; fi
    a=$(cd "$B" && TF_CPP_MIN_LOG_LEVEL=3 "$PY" bench_grad.py --worker "$DW" 2>/dev/null | ms)
    b=$(cd "$B" && TF_CPP_MIN_LOG_LEVEL=3 "$PY" bench_grad.py --worker "$SG" 2>/dev/null | ms)
    c=$(cd "$B" && TF_CPP_MIN_LOG_LEVEL=3 "$PY" bench_seed.py --worker "$SF" 2>/dev/null | ms)
    echo "$pkg: grad depthwise31 $a | grad seed16 $b | seed forward $c"
  done
done
