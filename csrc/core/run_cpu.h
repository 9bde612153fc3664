// The one launch function of the CPU kernels: both the TF op (csrc/tf/
// kernels_cpu.cc) and the pybind module _core (csrc/python/core_module.cc)
// call it, so what the _core tests run is what TensorFlow runs. The CPU twin
// of gpu::RunConvGpu (cuda/run_gpu.h). No TF or Python headers.
#pragma once

#include "dtypes.h"
#include "geometry.h"
#include "isa.h"
#include "parallel.h"
#include "plan.h"
#include "status.h"

namespace tfbigconv {

// Runs one pass with the algorithm of `choice` (from ChooseAlgorithm, or a
// requested algorithm with, for fft, choice.fft_plan from PlanFft). a, b are
// the problem's operands: (input, filter), (out_backprop, filter) or (input,
// out_backprop) for forward, backprop_input, backprop_filter. `out` is fully
// overwritten. `workspace` holds choice.fft_plan.workspace_bytes for fft (any
// alignment of 16 or more; may be null when that is 0); direct needs none.
// `isa` is the direct kernel's variant. Errors (kInvalidArgument, nothing
// written): an ISA this CPU or build cannot run, an fft choice without a
// plan, a plan for fewer workers than `parallel_for` has, a missing workspace.
Status RunConvCpu(const ConvProblem& problem, DType dtype, const AlgorithmChoice& choice,
                  const void* a, const void* b, void* out, void* workspace,
                  const ParallelFor& parallel_for, Isa isa);

// Both gradients of the forward geometry g (PlanLaneBackprop's cases) with
// plan from PlanLaneBackprop: x, w, dy in, dx, dw fully overwritten;
// `workspace` holds plan.workspace_bytes (any alignment). Errors
// (kInvalidArgument, nothing written): a plan for fewer workers than
// `parallel_for` has, a missing workspace.
Status RunLaneBackpropCpu(const ConvGeometry& g, DType dtype, const LaneBackpropPlan& plan,
                          const void* x, const void* w, const void* dy, void* dx, void* dw,
                          void* workspace, const ParallelFor& parallel_for);

}  // namespace tfbigconv
