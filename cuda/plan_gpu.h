// The GPU algorithm choice for one pass: "direct" or "fft" as requested, or
// for "auto" the one with the smaller estimated time among those that fit
// the workspace limit. The estimates and the comparison are the planner's
// (plan.cc, ChooseGpuKernel), with the process's active cost model, so the
// trace-time planner and this run-time choice agree. Host code.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "direct_gpu.h"
#include "fft_gpu.h"
#include "plan.h"
#include "status.h"

namespace tfbigconv {
namespace gpu {

struct GpuAlgorithmChoice {
  Algorithm algorithm = Algorithm::kDirect;  // cost_model.h; AlgorithmName names it
  DirectGpuPlan direct;  // always planned (it always fits, without splits)
  FftGpuPlan fft;        // valid when algorithm == kFft
  std::string reason;
  int64_t workspace_bytes() const {
    return algorithm == Algorithm::kFft ? fft.workspace_bytes : direct.workspace_bytes;
  }
};

// Errors: kTf requested (kInvalidArgument); kFft requested and cuFFT missing
// (kUnavailable) or no plan fits (kResourceExhausted).
Status ChooseGpuAlgorithm(const ConvProblem& problem, DType dtype, AlgorithmRequest requested,
                               int64_t workspace_limit, cudaStream_t stream,
                               GpuAlgorithmChoice* choice);

}  // namespace gpu
}  // namespace tfbigconv
