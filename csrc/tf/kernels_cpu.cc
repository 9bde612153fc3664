// CPU kernels of the three ops (kernel_base.h): BigConvDeviceBase's Run()
// with CpuDevice, which plans within the host budget and runs the pass with
// RunConvCpu (csrc/core/run_cpu.h, the launch _core also runs) on TF's
// intra-op thread pool.
#include <algorithm>
#include <string>

#include "isa.h"
#include "kernel_base.h"
#include "memory_info.h"
#include "plan.h"
#include "run_cpu.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/public/version.h"

namespace tfbigconv {
namespace {

// Fixed-size blocks: SchedulingParams::Fixed() exists from TF 2.20 on, where
// the constructor it wraps is deprecated.
tsl::thread::ThreadPool::SchedulingParams FixedBlocks(int64_t block) {
#if TF_MAJOR_VERSION == 2 && TF_MINOR_VERSION < 20
  return tsl::thread::ThreadPool::SchedulingParams(
      tsl::thread::ThreadPool::SchedulingStrategy::kFixedBlockSize, {}, block);
#else
  return tsl::thread::ThreadPool::SchedulingParams::Fixed(block);
#endif
}

// The intra-op pool, NumThreads() workers. The worker index is the block's:
// blocks are fixed and at most one per thread, so each has its own scratch.
// (The pool's thread ids run 0..NumThreads(), the caller included, and one of
// them is always idle: indexing scratch by them cost a worker's buffers.)
ParallelFor TfParallelFor(OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  const int threads = std::max(1, pool->NumThreads());
  return ParallelFor(threads, [pool, threads](int64_t total, const ParallelFor::Body& body) {
    // Equal blocks, one per pool thread: more shards than cores would put the
    // caller thread on a core too and make the threads evict each other's L2.
    const int64_t block = std::max<int64_t>(1, (total + threads - 1) / threads);
    pool->ParallelForWithWorkerId(
        total, FixedBlocks(block),
        [&body, block](int64_t begin, int64_t end, int) { body(begin, end, int(begin / block)); });
  });
}

// The CPU's part of BigConvDeviceBase (kernel_base.h): the host budget, the
// planner and RunConvCpu on TF's intra-op pool.
class CpuDevice {
 public:
  using Choice = AlgorithmChoice;
  explicit CpuDevice(OpKernelContext* ctx) : pf_(TfParallelFor(ctx)) {}
  int64_t DefaultBudget() const { return DefaultHostWorkspaceBudget(); }
  Status Choose(const ConvProblem& problem, DType dtype, AlgorithmRequest requested,
                int64_t limit, Choice* choice) const {
    return ChooseAlgorithm(problem.g, dtype, requested, limit, pf_.num_workers(), choice);
  }
  static void Log(const std::string& op_name, const Choice& choice) {
    VLOG(1) << op_name << ": " << AlgorithmName(choice.algorithm) << " (" << choice.reason << ")";
  }
  // The workspace comes from TF's allocator, within the limit the plan kept to.
  static int64_t WorkspaceBytes(const Choice& choice) {
    return choice.algorithm == Algorithm::kFft ? choice.fft_plan.workspace_bytes : 0;
  }
  Status Launch(const ConvProblem& problem, DType dtype, const Choice& choice, const void* a,
                const void* b, void* out, void* workspace) const {
    return RunConvCpu(problem, dtype, choice, a, b, out, workspace, pf_, ActiveIsa());
  }

 private:
  const ParallelFor pf_;
};

// BigConv2DBackprop: both gradients with the fused FFT backward where
// PlanLaneBackprop serves the case within the limit, else each as its own op
// would run it (BigConvDeviceBase::Run).
template <typename T>
class BigConv2DBackpropOp : public BigConvDeviceBase<CpuDevice, T> {
 public:
  using BigConvDeviceBase<CpuDevice, T>::BigConvDeviceBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    const Tensor& dy = ctx->input(2);
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, this->Geometry(Dims(input.shape()), Dims(filter.shape()), &g));
    OP_REQUIRES_OK(ctx, this->CheckOutBackprop(g, dy));
    Tensor *dx = nullptr, *dw = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, input.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, filter.shape(), &dw));
    const ParallelFor pf = TfParallelFor(ctx);
    const int64_t limit =
        this->workspace_limit_ > 0 ? this->workspace_limit_ : DefaultHostWorkspaceBudget();
    LaneBackpropPlan plan;
    const std::string why = this->algorithm_ == AlgorithmRequest::kDirect ||
                                    this->planned_ == AlgorithmRequest::kDirect
                                ? "direct was requested"
                                : PlanLaneBackprop(g, kDType<T>, limit, pf.num_workers(), &plan);
    if (!why.empty()) {
      VLOG(1) << this->name() << ": the two gradients on their own (" << why << ")";
      if (dx->NumElements() > 0)
        this->Run(ctx, BackpropInputProblem(g), this->Data(dy), this->Data(filter), this->Data(dx));
      if (!ctx->status().ok() || dw->NumElements() == 0) return;
      this->Run(ctx, BackpropFilterProblem(g), this->Data(input), this->Data(dy), this->Data(dw));
      return;
    }
    VLOG(1) << this->name() << ": fused fft backward, " << plan.fft_w << " points";
    Tensor workspace;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({plan.workspace_bytes}),
                                           &workspace));
    OP_REQUIRES_OK(ctx, ToTfStatus(RunLaneBackpropCpu(g, kDType<T>, plan, this->Data(input),
                                                      this->Data(filter), this->Data(dy),
                                                      this->Data(dx), this->Data(dw),
                                                      this->Data(&workspace), pf)));
  }
};

}  // namespace

TFBIGCONV_REGISTER_DEVICE_OPS(tensorflow::DEVICE_CPU, CpuDevice)
#define TFBIGCONV_REGISTER_CPU_BACKPROP(T)                                               \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name("BigConv2DBackprop").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      BigConv2DBackpropOp<T>);
TFBIGCONV_REGISTER_CPU_BACKPROP(Eigen::half)
TFBIGCONV_REGISTER_CPU_BACKPROP(Eigen::bfloat16)
TFBIGCONV_REGISTER_CPU_BACKPROP(float)
TFBIGCONV_REGISTER_CPU_BACKPROP(double)
// The 3-D ops: CPU only for now.
#define TFBIGCONV_REGISTER_CPU_OPS_3D(T) \
  TFBIGCONV_REGISTER_OPS("BigConv3D", tensorflow::DEVICE_CPU, BigConvDeviceBaseOfCpuDevice, T)
TFBIGCONV_REGISTER_CPU_OPS_3D(Eigen::half)
TFBIGCONV_REGISTER_CPU_OPS_3D(Eigen::bfloat16)
TFBIGCONV_REGISTER_CPU_OPS_3D(float)
TFBIGCONV_REGISTER_CPU_OPS_3D(double)

}  // namespace tfbigconv
