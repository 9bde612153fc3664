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
