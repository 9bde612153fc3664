#include "plan_gpu.h"


namespace tfbigconv {
namespace gpu {

std::string ChooseGpuAlgorithm(const ConvProblem& problem, DType dtype, const std::string& requested,
                               int64_t limit, cudaStream_t stream, GpuAlgorithmChoice* c) {
  const ConvGeometry& g = problem.g;
  if (requested != "auto" && requested != "direct" && requested != "fft")
    return "algorithm must be one of 'auto', 'direct' or 'fft', got '" + requested + "'";
  c->direct = PlanDirectGpu(g, dtype, limit);
  c->algorithm = GpuAlgorithm::kDirect;
  if (requested == "direct") {
    c->reason = "requested";
    return "";
  }
  const std::string fft_err = PlanFftGpu(g, dtype, limit, stream, &c->fft);
  if (requested == "fft") {
    if (!fft_err.empty()) return fft_err;
    c->algorithm = GpuAlgorithm::kFft;
    c->reason = "requested";
    return "";
  }
  Algorithm choice;
  c->reason = ChooseGpuKernel(problem, dtype, fft_err.empty(), &c->direct.seconds,
                              &c->fft.seconds, &choice);
  if (!fft_err.empty()) c->reason += " (" + fft_err + ")";
  c->algorithm = choice == Algorithm::kFft ? GpuAlgorithm::kFft : GpuAlgorithm::kDirect;
  return "";
}

}  // namespace gpu
}  // namespace tfbigconv
