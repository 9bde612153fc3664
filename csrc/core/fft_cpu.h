// FFT convolution on the CPU (overlap-save tiles, see FftPlan). All memory
// beyond the output comes from one caller-provided workspace of exactly
// plan.workspace_bytes.
#pragma once

#include "dtypes.h"
#include "geometry.h"
#include "parallel.h"
#include "plan.h"

namespace tfbigconv {

struct FftForwardParams {
  ConvGeometry g;
  DType dtype = DType::kFloat;
  FftPlan plan;  // from PlanFftForward, with plan.workers >= the ParallelFor's workers
  const void* input = nullptr;
  const void* filter = nullptr;
  void* output = nullptr;     // fully overwritten
  void* workspace = nullptr;  // plan.workspace_bytes, any alignment of 16 or more
};

void FftForward(const FftForwardParams& p, const ParallelFor& parallel_for);

}  // namespace tfbigconv
