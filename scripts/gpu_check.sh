#!/usr/bin/env bash
# Builds the TF-free CUDA harness (cuda/harness: the launchers as a pybind11
# module) and runs the CUDA kernel tests against the float64 NumPy reference
# (tests/reference.py), then prints timings against torch (cuDNN, torch.fft).
# Needs nvcc, CMake >= 3.24, pybind11, numpy, and CuPy or torch with CUDA.
#
#   scripts/gpu_check.sh                 build for this GPU, test, time
#   scripts/gpu_check.sh --compile-only  build for all architectures, import; no GPU needed
#   scripts/gpu_check.sh --quick --no-timings --seed-batch 16   (options of check_kernels.py)
#
# PYTHON picks the interpreter (default: python3); BUILD_DIR the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build/gpu_harness}
COMPILE_ONLY=0
if [[ "${1:-}" == "--compile-only" ]]; then
  COMPILE_ONLY=1
  shift
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
exec "$PYTHON" cuda/harness/check_kernels.py "$@"
