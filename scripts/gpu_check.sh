#!/usr/bin/env bash
# Builds the TF-free CUDA harness (cuda/harness: the launchers as a pybind11
# module) and runs the CUDA kernel tests against the float64 NumPy reference
# (tests/reference.py), then prints timings against torch (cuDNN, torch.fft).
# Needs nvcc, CMake >= 3.24, pybind11, numpy, and CuPy or torch with CUDA.
#
#   scripts/gpu_check.sh                 build for this GPU, test, time
#   scripts/gpu_check.sh --compile-only  build for all architectures, import; no GPU needed
#   scripts/gpu_check.sh --quick --no-timings --seed-batch 16   (options of check_kernels.py)
#   scripts/gpu_check.sh --calibrate [DIR] [--dtypes float32]
#       time the grid (ours and cuDNN through torch) into DIR/gpu_grid_*.csv
#       (default DIR: build/gpu_calibration), then, where tfbigconv (with
#       TensorFlow) imports, fit the GPU section into DIR/cost_model.json;
#       elsewhere run `python -m tfbigconv fit-gpu DIR/gpu_grid_*.csv` later
#
# PYTHON picks the interpreter (default: python3); BUILD_DIR the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build/gpu_harness}
COMPILE_ONLY=0
CALIBRATE_DIR=""
if [[ "${1:-}" == "--compile-only" ]]; then
  COMPILE_ONLY=1
  shift
elif [[ "${1:-}" == "--calibrate" ]]; then
  shift
  CALIBRATE_DIR=build/gpu_calibration
  if [[ $# -gt 0 && "$1" != --* ]]; then CALIBRATE_DIR=$1; shift; fi
fi

command -v nvcc >/dev/null || { echo "gpu_check: nvcc not found" >&2; exit 2; }
cfg=(-S cuda/harness -B "$BUILD_DIR" -DPython_EXECUTABLE="$(command -v "$PYTHON")"
     -DCMAKE_BUILD_TYPE=Release)
if "$PYTHON" -c "import ninja" 2>/dev/null || command -v ninja >/dev/null; then cfg+=(-G Ninja); fi
# On a GPU machine build for that GPU only (faster); compile-only builds the
# release architecture list, which is what CI and users get.
if [[ $COMPILE_ONLY == 0 ]]; then cfg+=(-DTFBIGCONV_CUDA_ARCHITECTURES=native); fi
start=$(date +%s)
cmake "${cfg[@]}" >/dev/null
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
echo "gpu_check: harness built in $(( $(date +%s) - start )) s ($BUILD_DIR)"

export PYTHONPATH="$BUILD_DIR:tests${PYTHONPATH:+:$PYTHONPATH}"
if [[ $COMPILE_ONLY == 1 ]]; then
  "$PYTHON" -c "import tfbigconv_gpu_harness as h; ok, why = h.cufft_status(); \
print('gpu_check: harness imports; cuFFT', 'found' if ok else 'not found: ' + why); \
print(h.output_shape([200, 321, 481, 1], [135, 135, 1, 3], [1, 1], [1, 1], 'VALID', [], 'NHWC'))"
  echo "gpu_check: compile-only OK (kernels not run)"
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
if [[ -n $CALIBRATE_DIR ]]; then
  "$PYTHON" cuda/harness/check_kernels.py --no-matrix --calibrate "$CALIBRATE_DIR" "$@"
  if (cd /tmp && "$PYTHON" -c "import tfbigconv" 2>/dev/null); then
    "$PYTHON" -m tfbigconv fit-gpu --output "$CALIBRATE_DIR/cost_model.json" \
      "$CALIBRATE_DIR"/gpu_grid_*.csv
  else
    echo "gpu_check: tfbigconv does not import here (no TensorFlow); grid written, not fitted:"
    echo "  run python -m tfbigconv fit-gpu $CALIBRATE_DIR/gpu_grid_*.csv where it does"
  fi
  exit 0
fi
exec "$PYTHON" cuda/harness/check_kernels.py "$@"
