#include "plan_gpu.h"

namespace tfbigconv {
namespace gpu {

Status ChooseGpuAlgorithm(const ConvProblem& problem, DType dtype, const std::string& requested,
                          int64_t limit, cudaStream_t stream, GpuAlgorithmChoice* c) {
  const ConvGeometry& g = problem.g;
  if (requested != "auto" && requested != "direct" && requested != "fft")
    return Status::InvalidArgument("algorithm must be one of 'auto', 'direct' or 'fft', got '" +
                                   requested + "'");
  c->direct = PlanDirectGpu(problem, dtype, limit);
  c->algorithm = Algorithm::kDirect;
  if (requested == "direct") {
    c->reason = "requested";
    return Status::Ok();
  }
  std::string why_no_cufft;
  const bool have_cufft = CufftAvailable(&why_no_cufft);
  const std::string fft_err = have_cufft ? PlanFftGpu(g, dtype, limit, stream, &c->fft)
                                         : "GPU fft unavailable: " + why_no_cufft;
  if (requested == "fft") {
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
