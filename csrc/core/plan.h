// The planner of one pass: every candidate's estimate (TF's kernel, direct,
// fft) and the choice among them, for the trace-time planner (PlanPass) and
// for the CPU kernels at run time (ChooseAlgorithm). Its parts: the FFT's
// tiling (fft_plan.h), TF's cost model (tf_estimate.h), the GPU estimate
// (gpu_estimate.h); the constants are cost_model.h's.
#pragma once

#include <cstdint>
#include <string>

#include "cost_model.h"
#include "dtypes.h"
#include "estimate.h"
#include "fft_plan.h"
#include "geometry.h"
#include "status.h"
#include "tf_estimate.h"

namespace tfbigconv {

// The kernels' choice for one ConvProblem's geometry (of any pass): "direct"
// or "fft" as requested, or for "auto" the fastest estimate that fits.
struct AlgorithmChoice {
  Algorithm algorithm = Algorithm::kDirect;
  Estimate direct, fft;
  FftPlan fft_plan;     // valid when fft.fits
  std::string reason;
};

// Errors: kTf requested (kInvalidArgument: the kernels run ours only), or
// nothing requested fits the limit (kResourceExhausted; the message states
// the minimum).
Status ChooseAlgorithm(const ConvGeometry& g, DType dtype, AlgorithmRequest requested,
                       int64_t workspace_limit, int workers, AlgorithmChoice* choice);

// Every candidate of one pass and the choice among them (chosen: kTf,
// kDirect or kFft).
struct PassPlan {
  Pass pass = Pass::kForward;
  Device device = Device::kCpu;
  int64_t limit = 0;                     // the workspace limit planned with
  TfKernel tf_kernel = TfKernel::kNone;  // TF's kernel for the case
  Estimate tf, direct, fft;
  FftPlan fft_plan;     // CPU only
  AlgorithmRequest chosen = AlgorithmRequest::kDirect;
  std::string reason;
};
// Errors: kUnavailable (kTf requested where TF cannot run the case),
// kResourceExhausted (nothing requested fits).
Status PlanPass(const ConvGeometry& user_g, Pass pass, DType dtype, Device device,
                AlgorithmRequest requested, int64_t limit, int workers, const TfCandidate& tf,
                PassPlan* plan);

}  // namespace tfbigconv
