#include "plan_gpu.h"

namespace tfbigconv {
namespace gpu {

Status ChooseGpuAlgorithm(const ConvProblem& problem, DType dtype, AlgorithmRequest requested,
                          int64_t limit, cudaStream_t stream, GpuAlgorithmChoice* c) {
  const ConvGeometry& g = problem.g;
  if (requested == AlgorithmRequest::kTf)
    return Status::InvalidArgument("algorithm must be one of 'auto', 'direct' or 'fft', got 'tf'");
  c->direct = PlanDirectGpu(problem, dtype, limit);
  c->algorithm = Algorithm::kDirect;
  if (requested == AlgorithmRequest::kDirect) {
    c->reason = "requested";
    return Status::Ok();
  }
  std::string why_no_cufft;
  const bool have_cufft = CufftAvailable(&why_no_cufft);
  const std::string fft_err = have_cufft ? PlanFftGpu(g, dtype, limit, stream, &c->fft)
                                         : "GPU fft unavailable: " + why_no_cufft;
  if (requested == AlgorithmRequest::kFft) {
    if (!have_cufft) return Status::Unavailable(fft_err);
    if (!fft_err.empty()) return Status::ResourceExhausted(fft_err);
    c->algorithm = Algorithm::kFft;
    c->reason = "requested";
    return Status::Ok();
  }
  c->reason = ChooseGpuKernel(problem, dtype, fft_err.empty(), &c->direct.seconds,
                              &c->fft.seconds, &c->algorithm);
  if (!fft_err.empty()) c->reason += " (" + fft_err + ")";
  return Status::Ok();
}

}  // namespace gpu
}  // namespace tfbigconv
