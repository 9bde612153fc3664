#!/usr/bin/env bash
# The GPU work that issue 11 still owes, in one call on a GPU machine: proves
# the depthwise direct kernel (cuda/direct_gpu.cu, DirectDepthwiseKernel) and
# re-times the depthwise rows of the calibration grids with it, so that the GPU
# model can be refitted. Then, where TensorFlow is (not the GPU machine):
#   python benchmarks/gpu_replace_rows.py OUT_DIR/gpu_*.csv --into benchmarks/gpu
#   python -m tfbigconv fit-gpu benchmarks/gpu/*.csv --output tfbigconv/cost_model/cost_model.json
#   (cd benchmarks && python gpu_dispatch_regret.py gpu/*.csv --loo --autotune)
#
#   scripts/gpu_recalibrate_depthwise.sh OUT_DIR [--skip-matrix]
#
# Writes into OUT_DIR: matrix.log (the full kernel matrix, every dtype),
# memcheck.log (compute-sanitizer on the depthwise cases), and the depthwise
# geometries of the grid and of the two random draws that benchmarks/gpu/
# holds (gpu_grid_*.csv, gpu_random_7_*.csv: every algorithm's rows, timed
# together so that they compare on whichever GPU this is).
# Exit status: non-zero when a kernel check fails or memcheck reports errors.
# Where one call has a time limit (10 minutes on the lent machines), run the
# matrix alone first (scripts/gpu_check.sh --no-timings), then this with
# --skip-matrix (which still builds the harness).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_recalibrate_depthwise.sh OUT_DIR [--skip-matrix]}
SKIP_MATRIX=0
[[ "${2:-}" == "--skip-matrix" ]] && SKIP_MATRIX=1
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build/gpu_harness}
mkdir -p "$OUT"
status=0

# Builds the harness for this GPU, then runs the whole matrix (no timings).
if [[ $SKIP_MATRIX == 0 ]]; then
  scripts/gpu_check.sh --no-timings >"$OUT/matrix.log" 2>&1 || status=1
  tail -n 3 "$OUT/matrix.log"
else
  scripts/gpu_check.sh --no-matrix --no-timings >"$OUT/build.log" 2>&1 || status=1
fi

export PYTHONPATH="$BUILD_DIR:tests${PYTHONPATH:+:$PYTHONPATH}"
check=(cuda/harness/check_kernels.py)
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$PYTHON" "${check[@]}" \
    --depthwise-only --no-timings >"$OUT/memcheck.log" 2>&1 || status=1
  grep -E "kernel tests|ERROR SUMMARY" "$OUT/memcheck.log"
else
  echo "gpu_recalibrate_depthwise: compute-sanitizer not found; memcheck skipped"
fi

# The depthwise rows: the grid (every dtype), draw 7 as benchmarks/gpu/ has
# it (80 geometries in float32, the first 24 of them in float16).
calib=("$PYTHON" "${check[@]}" --no-matrix --depthwise-only --calibrate "$OUT")
"${calib[@]}" >"$OUT/calibrate_grid.log" 2>&1 || status=1
"${calib[@]}" --random-grid 7,80 --dtypes float32 >"$OUT/calibrate_random_f32.log" 2>&1 || status=1
"${calib[@]}" --random-grid 7,24 --dtypes float16 >"$OUT/calibrate_random_f16.log" 2>&1 || status=1
ls -l "$OUT"
exit $status
