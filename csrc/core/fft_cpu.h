// FFT convolution on the CPU (overlap-save tiles, see FftPlan). All memory
// beyond the output comes from one caller-provided workspace of exactly
// plan.workspace_bytes.
#pragma once

#include "dtypes.h"
#include "geometry.h"
#include "parallel.h"
#include "fft_plan.h"

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

// Both gradients of a 1-D depthwise convolution from one transform of
// dL/doutput per image (LaneBackpropPlan, fft_plan.h). Tensors in the forward
// problem's layouts; both gradients are fully overwritten. A NaN, an Inf or a
// value the transforms could overflow with sends both passes to the direct
// kernel, as the separate FFT passes do.
struct LaneBackpropParams {
  ConvProblem problem;  // the forward pass (ForwardProblem)
  DType dtype = DType::kFloat;
  LaneBackpropPlan plan;  // from PlanLaneBackprop, for at least the ParallelFor's workers
  const void* input = nullptr;
  const void* filter = nullptr;
  const void* out_backprop = nullptr;
  void* input_backprop = nullptr;
  void* filter_backprop = nullptr;
  void* workspace = nullptr;  // plan.workspace_bytes, any alignment
};

void FftLaneBackprop(const LaneBackpropParams& p, const ParallelFor& parallel_for);

}  // namespace tfbigconv
