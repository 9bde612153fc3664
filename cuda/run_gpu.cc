#include "run_gpu.h"

#include <string>

namespace tfbigconv {
namespace gpu {

Status RunConvGpu(const ConvProblem& problem, DType dtype, const GpuAlgorithmChoice& choice,
                  const void* a, const void* b, void* out, void* workspace, cudaStream_t stream) {
  if (problem.g.output_elements() == 0) return Status::Ok();
  if (problem.g.empty_sums()) {  // zeros, as tf.nn.conv2d gives; every output is dense
    const cudaError_t e = cudaMemsetAsync(
        out, 0, size_t(problem.g.output_elements() * DTypeBytes(dtype)), stream);
    if (e == cudaSuccess) return Status::Ok();
    return Status::Internal(std::string("zeroing an empty sum: ") + cudaGetErrorString(e));
  }
  if (choice.workspace_bytes() > 0 && !workspace)
    return Status::InvalidArgument("the plan needs a workspace of " +
                                   std::to_string(choice.workspace_bytes()) +
                                   " bytes and none was given");
  const GpuOperands operands{problem, dtype, a, b, out, workspace};
  const std::string err = choice.algorithm == Algorithm::kFft
                              ? FftConvGpu({operands, choice.fft}, stream)
                              : DirectConvGpu({operands, choice.direct}, stream);
  return err.empty() ? Status::Ok() : Status::Internal(err);
}

}  // namespace gpu
}  // namespace tfbigconv
