#include "gpu_estimate.h"

#include "checked_math.h"
#include "fft_gpu_layout.h"

namespace tfbigconv {

Algorithm GpuOursEstimates(const ConvProblem& problem, DType dtype, const ConvGeometry& ug,
                           int64_t limit, Estimate* direct, Estimate* fft) {
  const int64_t operands = OperandBytes(ug, dtype);
  const int64_t fft_min = FftGpuMinWorkspaceBytes(problem.g, dtype);
  double ds, fs;
  Algorithm choice;
  ChooseGpuKernel(problem, dtype, fft_min <= limit, &ds, &fs, &choice);
  auto fill = [&](Estimate* e, GpuCandidate c, double seconds, int64_t ws, const char* note) {
    const GpuModelTerms t = GpuTerms(problem.g, c);
    e->available = true;
    e->seconds = seconds;
    e->workspace_bytes = ws;
    e->fits = ws <= limit;
    e->peak_bytes = SatAdd(operands, ws);
    e->note = note;
    e->terms.assign(t.features, t.features + kGpuFeatures);
    e->terms.insert(e->terms.begin(), t.work);
  };
  fill(direct, GpuCandidate::kDirect, ds, 0, "partial sums only within the budget");
  fill(fft, GpuCandidate::kFft, fs, fft_min,
       "smallest plan; the kernel tiles and chunks within the budget at run time");
  return choice;
}

}  // namespace tfbigconv
