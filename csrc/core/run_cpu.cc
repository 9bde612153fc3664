#include "run_cpu.h"

#include <string>

#include "direct_cpu.h"
#include "fft_cpu.h"

namespace tfbigconv {
namespace {

// The fields DirectParams and FftParams share.
template <typename Params>
Params WithOperands(const ConvProblem& problem, DType dtype, const void* a, const void* b,
                    void* out) {
  Params p;
  p.problem = problem;
  p.dtype = dtype;
  p.input = a;
  p.filter = b;
  p.output = out;
  return p;
}

// A plan's per-worker buffers and workspace against the pool and the
// caller's workspace: `what` ("the fft plan") names the plan in the message.
Status CheckPlanBuffers(const std::string& what, int plan_workers, int64_t workspace_bytes,
                        const void* workspace, const ParallelFor& parallel_for) {
  // Each worker id indexes its own buffer in the workspace.
  if (plan_workers < parallel_for.num_workers())
    return Status::InvalidArgument(what + " has buffers for " + std::to_string(plan_workers) +
                                   " workers, but the thread pool has " +
                                   std::to_string(parallel_for.num_workers()));
  if (workspace_bytes > 0 && !workspace)
    return Status::InvalidArgument(what + " needs a workspace of " +
                                   std::to_string(workspace_bytes) + " bytes and none was given");
  return Status::Ok();
}

}  // namespace

Status RunConvCpu(const ConvProblem& problem, DType dtype, const AlgorithmChoice& choice,
                  const void* a, const void* b, void* out, void* workspace,
                  const ParallelFor& parallel_for, Isa isa) {
  const ConvGeometry& g = problem.g;
  if (g.output_elements() == 0) return Status::Ok();
  if (g.empty_sums()) {  // zeros, as tf.nn.conv2d gives; needs no plan or workspace
    ZeroConvOutput(problem, dtype, out);
    return Status::Ok();
  }
  if (choice.algorithm == Algorithm::kDirect) {
    // An unsupported variant would die on an illegal instruction.
    const Status isa_ok = CheckIsaSupported(isa);
    if (!isa_ok.ok()) return isa_ok;
    DirectConv(WithOperands<DirectParams>(problem, dtype, a, b, out), parallel_for, isa);
    return Status::Ok();
  }
  const FftPlan& plan = choice.fft_plan;
  if (plan.items <= 0 || plan.chunk <= 0)
    return Status::InvalidArgument("the fft choice carries no plan (fft_plan is empty)");
  const Status buffers =
      CheckPlanBuffers("the fft plan", plan.workers, plan.workspace_bytes, workspace, parallel_for);
  if (!buffers.ok()) return buffers;
  FftParams p = WithOperands<FftParams>(problem, dtype, a, b, out);
  p.plan = plan;
  p.workspace = workspace;
  FftConv(p, parallel_for);
  return Status::Ok();
}

Status RunLaneBackpropCpu(const ConvGeometry& g, DType dtype, const LaneBackpropPlan& plan,
                          const void* x, const void* w, const void* dy, void* dx, void* dw,
                          void* workspace, const ParallelFor& parallel_for) {
  const Status buffers = CheckPlanBuffers("the fused backward's plan", plan.workers,
                                          plan.workspace_bytes, workspace, parallel_for);
  if (!buffers.ok()) return buffers;
  LaneBackpropParams p;
  p.problem = ForwardProblem(g);
  p.dtype = dtype;
  p.plan = plan;
  p.input = x;
  p.filter = w;
  p.out_backprop = dy;
  p.input_backprop = dx;
  p.filter_backprop = dw;
  p.workspace = workspace;
  FftLaneBackprop(p, parallel_for);
  return Status::Ok();
}

}  // namespace tfbigconv
