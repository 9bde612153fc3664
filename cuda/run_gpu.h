// The one launch function of the GPU kernels: both the TF op (csrc/tf/
// kernels_gpu.cc) and the TF-free harness (cuda/harness) call it, so what the
// harness proves is what TensorFlow runs. No TF headers.
#pragma once

#include <cuda_runtime_api.h>

#include "dtypes.h"
#include "geometry.h"
#include "plan_gpu.h"
#include "status.h"

namespace tfbigconv {
namespace gpu {

// Enqueues one pass on `stream` with the algorithm and plan of `choice` (from
// ChooseGpuAlgorithm on problem.g). a, b are the problem's input and filter
// operands: (input, filter), (out_backprop, filter) or (input, out_backprop)
// for forward, backprop_input, backprop_filter. `out` is fully overwritten;
// `workspace` holds choice.workspace_bytes() (256-byte aligned; may be null
// when that is 0). A missing workspace is InvalidArgument, a failed launch
// Internal. Does not synchronize (the twin of RunConvCpu, csrc/core/run_cpu.h).
Status RunConvGpu(const ConvProblem& problem, DType dtype, const GpuAlgorithmChoice& choice,
                  const void* a, const void* b, void* out, void* workspace, cudaStream_t stream);

}  // namespace gpu
}  // namespace tfbigconv
