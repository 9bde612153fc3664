#!/usr/bin/env bash
# Issue 41's GPU measurements in one call of a lent GPU machine (10 minutes at
# most): builds the harness for this GPU, then runs, in order of value, each
# step cut off at the deadline, and packs the logs and CSVs into
# OUT/results.tgz after every step (what finished comes back even if the
# call is cut short):
#   1. correctness: the full kernel matrix (every dtype) and compute-sanitizer
#      memcheck on the subset and on the depthwise cases, side by side (they
#      time nothing);
#   2. the target timings (seed, K sweep, fwd+bwd; check_kernels.py);
#   3. the calibration grid in float32, then a fresh random grid (RANDOM_SEED,
#      default 13; draws 7 and 11 are fitted) in float32, as fit data and
#      held-out data;
#   4. the fft chunk sweep and kernel breakdown (profile_kernels.py);
#   5. the grid and random grid in float16, then the grid in bfloat16;
#   6. the depthwise rows of random draw 7 (benchmarks/gpu/gpu_random_7_*).
# Then, where TensorFlow is: tar xzf results.tgz; python -m tfbigconv fit-gpu ...;
# benchmarks/gpu_dispatch_regret.py (docs/gpu.md, "Fitting").
#
#   scripts/gpu_measure.sh OUT [SECONDS [STEP ...]]   (default 540 s; the steps above;
#       run_step below lists the others: re-timing after a kernel change)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gpu_measure.sh OUT [SECONDS]}
BUDGET=${2:-540}
shift $(( $# < 2 ? $# : 2 ))
PYTHON=${PYTHON:-python3}
export BUILD_DIR=${BUILD_DIR:-build/gpu_harness}
START=$(date +%s)
W=$(mktemp -d)
mkdir -p "$OUT"

pack() { tar czf "$OUT/results.tgz" -C "$W" . 2>/dev/null; }
left() { echo $(( START + BUDGET - $(date +%s) )); }
# step NAME CAP command...: runs command with the smaller of CAP and the time left.
step() {
  local name=$1 cap=$2 rem t0
  shift 2
  rem=$(left)
  (( rem < 15 )) && { echo "[$name] skipped: out of time" | tee -a "$W/steps.log"; return; }
  (( cap > rem )) && cap=$rem
  t0=$(date +%s)
  timeout "$cap" "$@" >"$W/$name.log" 2>&1
  echo "[$name] rc=$? in $(( $(date +%s) - t0 )) s (cap $cap)" | tee -a "$W/steps.log"
  pack
}

{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
  nvcc --version | tail -1; git log -1 --format='commit %H %s'; git status --short; nproc; } >"$W/env.log" 2>&1
step build 240 scripts/gpu_check.sh --no-matrix --no-timings
compgen -G "$BUILD_DIR/tfbigconv_gpu_harness*.so" >/dev/null || { echo "build failed"; tail -20 "$W/build.log"; exit 1; }
export PYTHONPATH="$BUILD_DIR:tests:cuda/harness${PYTHONPATH:+:$PYTHONPATH}"
CK=(cuda/harness/check_kernels.py)

# correctness: the matrix and memcheck side by side (they time nothing)
correctness() {
  local rem cap t0 p1 p2 p3 r1 r2 r3
  rem=$(left); cap=$(( rem < 170 ? rem : 170 ))
  t0=$(date +%s)
  timeout "$cap" "$PYTHON" "${CK[@]}" --no-timings >"$W/matrix.log" 2>&1 & p1=$!
  timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 3 "$PYTHON" "${CK[@]}" \
    --subset --no-timings >"$W/memcheck_subset.log" 2>&1 & p2=$!
  timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 3 "$PYTHON" "${CK[@]}" \
    --depthwise-only --no-timings >"$W/memcheck_depthwise.log" 2>&1 & p3=$!
  wait $p1; r1=$?; wait $p2; r2=$?; wait $p3; r3=$?
  echo "[correctness] matrix rc=$r1 memcheck subset rc=$r2 depthwise rc=$r3 in $(( $(date +%s) - t0 )) s (cap $cap)" | tee -a "$W/steps.log"
  grep -h -E "kernel tests|ERROR SUMMARY" "$W"/matrix.log "$W"/memcheck_*.log | tee -a "$W/steps.log"
  pack
}

CAL=("$PYTHON" "${CK[@]}" --no-matrix --calibrate)
FFT=(--algos fft)  # the fft rows alone (after a change to the fft kernels)
run_step() {
  case $1 in
    correctness) correctness ;;
    timings) step timings 75 "$PYTHON" "${CK[@]}" --no-matrix --seed-batch 200 ;;
    ranks) step ranks 150 "$PYTHON" "${CK[@]}" --no-matrix --ranks ;;
    profile_ranks) step profile_ranks 60 "$PYTHON" cuda/harness/profile_kernels.py --no-sweep --ranks --algos fft ;;
    profile) step profile 70 "$PYTHON" cuda/harness/profile_kernels.py --csv "$W/chunk_sweep.csv" ;;
    grid_f32) step grid_f32 120 "${CAL[@]}" "$W/grid_f32" --dtypes float32 ;;
    # a fresh held-out draw: RANDOM_SEED (default 13; 7 and 11 are fitted)
    random_f32) step random_f32 110 "${CAL[@]}" "$W/random${RANDOM_SEED:-13}_f32" --dtypes float32 --random-grid "${RANDOM_SEED:-13}",40 ;;
    random_f16) step random_f16 60 "${CAL[@]}" "$W/random${RANDOM_SEED:-13}_f16" --dtypes float16 --random-grid "${RANDOM_SEED:-13}",16 ;;
    grid_f16) step grid_f16 90 "${CAL[@]}" "$W/grid_f16" --dtypes float16 ;;
    grid_bf16) step grid_bf16 90 "${CAL[@]}" "$W/grid_bf16" --dtypes bfloat16 ;;
    random7_dw_f32) step random7_dw_f32 60 "${CAL[@]}" "$W/random7_dw" --depthwise-only --dtypes float32 --random-grid 7,80 ;;
    random7_dw_f16) step random7_dw_f16 40 "${CAL[@]}" "$W/random7_dw_f16" --depthwise-only --dtypes float16 --random-grid 7,24 ;;
    # re-timing after a kernel change: fft rows, and direct rows of depthwise layers
    fft_grid_f32) step fft_grid_f32 40 "${CAL[@]}" "$W/fft_grid_f32" --dtypes float32 "${FFT[@]}" ;;
    fft_random11_f32) step fft_random11_f32 40 "${CAL[@]}" "$W/fft_random11_f32" --dtypes float32 --random-grid 11,40 "${FFT[@]}" ;;
    fft_grid_f16) step fft_grid_f16 30 "${CAL[@]}" "$W/fft_grid_f16" --dtypes float16,bfloat16 "${FFT[@]}" ;;
    fft_random11_f16) step fft_random11_f16 20 "${CAL[@]}" "$W/fft_random11_f16" --dtypes float16 --random-grid 11,16 "${FFT[@]}" ;;
    dw_direct_grid) step dw_direct_grid 40 "${CAL[@]}" "$W/dw_direct_grid" --depthwise-only --algos direct ;;
    dw_direct_random11) step dw_direct_random11 30 "${CAL[@]}" "$W/dw_direct_random11" --depthwise-only --algos direct --dtypes float32,float16 --random-grid 11,40 ;;
    *) echo "unknown step $1" | tee -a "$W/steps.log" ;;
  esac
}
STEPS=("$@")
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=(correctness timings grid_f32 random_f32 profile grid_f16
                                    random_f16 grid_bf16 random7_dw_f32 random7_dw_f16)
for s in "${STEPS[@]}"; do run_step "$s"; done
cat "$W/steps.log"
exit 0
