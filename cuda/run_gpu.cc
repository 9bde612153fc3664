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
  if (choice.algorithm == GpuAlgorithm::kFft) {
    FftGpuParams p;
    p.problem = problem;
    p.dtype = dtype;
    p.plan = choice.fft;
    p.input = a;
    p.filter = b;
    p.output = out;
    p.workspace = workspace;
    return FftConvGpu(p, stream);
  }
  DirectGpuParams p;
  p.problem = problem;
  p.dtype = dtype;
  p.plan = choice.direct;
  p.input = a;
  p.filter = b;
  p.output = out;
  p.workspace = workspace;
  return DirectConvGpu(p, stream);
}

}  // namespace gpu
}  // namespace tfbigconv
