// FFT convolution on the CPU (overlap-save tiles, see FftPlan). All memory
// beyond the output comes from one caller-provided workspace of exactly
// plan.workspace_bytes.
#pragma once

#include "dtypes.h"
#include "geometry.h"
#include "parallel.h"
#include "plan.h"

namespace tfbigconv {

struct FftParams {
  ConvProblem problem;  // the forward pass, or a gradient posed as a convolution
  DType dtype = DType::kFloat;
  FftPlan plan;  // from PlanFft, with plan.workers >= the ParallelFor's workers
  const void* input = nullptr;
  const void* filter = nullptr;
  void* output = nullptr;     // fully overwritten
  void* workspace = nullptr;  // plan.workspace_bytes, any alignment of 16 or more
};

void FftConv(const FftParams& p, const ParallelFor& parallel_for);

}  // namespace tfbigconv
