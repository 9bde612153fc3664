#include "plan_gpu.h"

#include <sstream>

namespace tfbigconv {
namespace gpu {

std::string ChooseGpuAlgorithm(const ConvGeometry& g, DType dtype, const std::string& requested,
                               int64_t limit, cudaStream_t stream, GpuAlgorithmChoice* c) {
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
  std::ostringstream why;
  if (!fft_err.empty()) {
    why << "fft not possible (" << fft_err << "); direct";
  } else {
    if (c->fft.seconds < c->direct.seconds) c->algorithm = GpuAlgorithm::kFft;
    why << "estimated direct " << c->direct.seconds << " s, fft " << c->fft.seconds << " s";
  }
  c->reason = why.str();
  return "";
}

}  // namespace gpu
}  // namespace tfbigconv
