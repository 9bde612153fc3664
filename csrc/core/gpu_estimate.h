// Our two kernels' estimates on the GPU for the trace-time planner: the
// run-time chooser's (ChooseGpuKernel, as cuda/plan_gpu.cc makes it) and the
// smallest FFT workspace (fft_gpu_layout.h).
#pragma once

#include <cstdint>

#include "cost_model.h"
#include "dtypes.h"
#include "estimate.h"
#include "geometry.h"

namespace tfbigconv {

// Fills *direct and *fft for one pass (problem) of the user's geometry ug
// within `limit`, and returns the kernel the run-time chooser would pick.
Algorithm GpuOursEstimates(const ConvProblem& problem, DType dtype, const ConvGeometry& ug,
                           int64_t limit, Estimate* direct, Estimate* fft);

}  // namespace tfbigconv
