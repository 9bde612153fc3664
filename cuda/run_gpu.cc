#include "run_gpu.h"

namespace tfbigconv {
namespace gpu {

const char* GpuAlgorithmName(GpuAlgorithm a) {
  return a == GpuAlgorithm::kFft ? "fft" : "direct";
}

std::string RunConvGpu(const ConvProblem& problem, DType dtype, const GpuAlgorithmChoice& choice,
                       const void* a, const void* b, void* out, void* workspace,
                       cudaStream_t stream) {
  if (problem.g.output_elements() == 0) return "";
  if (problem.g.empty_sums()) {  // zeros, as tf.nn.conv2d gives; every output is dense
    const cudaError_t e = cudaMemsetAsync(
        out, 0, size_t(problem.g.output_elements() * DTypeBytes(dtype)), stream);
    return e == cudaSuccess ? "" : std::string("zeroing an empty sum: ") + cudaGetErrorString(e);
  }
  if (choice.workspace_bytes() > 0 && !workspace)
    return "the plan needs a workspace of " + std::to_string(choice.workspace_bytes()) +
           " bytes and none was given";
  const GpuOperands operands{problem, dtype, a, b, out, workspace};
  if (choice.algorithm == GpuAlgorithm::kFft) return FftConvGpu({operands, choice.fft}, stream);
  return DirectConvGpu({operands, choice.direct}, stream);
}

}  // namespace gpu
}  // namespace tfbigconv
