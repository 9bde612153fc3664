// CPU kernels of the three ops (kernel_base.h): a Run() that plans within
// the host budget, takes the workspace from TensorFlow's allocator and runs
// the pass with RunConvCpu (csrc/core/run_cpu.h, the launch _core also runs)
// on TF's intra-op thread pool.
#include <algorithm>
#include <string>

#include "isa.h"
#include "kernel_base.h"
#include "memory_info.h"
#include "plan.h"
#include "run_cpu.h"
#include "tensorflow/core/platform/logging.h"

namespace tfbigconv {
namespace {

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
        total, tsl::thread::ThreadPool::SchedulingParams::Fixed(block),
        [&body, block](int64_t begin, int64_t end, int) { body(begin, end, int(begin / block)); });
  });
}

template <typename T>
class BigConvCpuBase : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;

 protected:
  void Run(OpKernelContext* ctx, const ConvProblem& problem, const void* in, const void* filter,
           void* out) {
    const ConvGeometry& g = problem.g;
    if (g.output_elements() == 0) return;
    const ParallelFor pf = TfParallelFor(ctx);
    const int64_t limit =
        this->workspace_limit_ > 0 ? this->workspace_limit_ : DefaultHostWorkspaceBudget();
    AlgorithmChoice choice;
    OP_REQUIRES_OK(ctx, this->ChooseWithPlan([&](const std::string& requested) {
      return ChooseAlgorithm(g, kDType<T>, requested, limit, pf.num_workers(), &choice);
    }));
    VLOG(1) << this->name() << ": " << AlgorithmName(choice.algorithm) << " (" << choice.reason
            << ")";
    // The workspace comes from TF's allocator, within the limit the plan kept to.
    Tensor workspace;
    void* ws = nullptr;
    if (choice.algorithm == Algorithm::kFft && choice.fft_plan.workspace_bytes > 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                             TensorShape({choice.fft_plan.workspace_bytes}),
                                             &workspace));
      ws = this->Data(&workspace);
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(RunConvCpu(problem, kDType<T>, choice, in, filter, out, ws, pf,
                                              ActiveIsa())));
  }
};

}  // namespace

#define REGISTER(T) TFBIGCONV_REGISTER_OPS(tensorflow::DEVICE_CPU, BigConvCpuBase, T)
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
REGISTER(float)
REGISTER(double)
#undef REGISTER

}  // namespace tfbigconv
