// GPU kernels of the three ops (built with GOOGLE_CUDA): the ops of
// kernel_base.h with a Run() that plans within the allocator's budget, takes
// the workspace from TensorFlow's allocator and enqueues the pass with
// gpu::RunConvGpu (cuda/run_gpu.h, the launch the harness also tests) on the
// op's stream. The only file where TF meets the CUDA code.
#if GOOGLE_CUDA

#include <cuda_runtime_api.h>

#include <string>

#include "kernel_base.h"
#include "memory_info.h"
#include "plan_gpu.h"
#include "run_gpu.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/platform/logging.h"
#include "xla/stream_executor/stream.h"

namespace tfbigconv {
namespace {

// A fraction of what the device allocator can still hand out; 0 if it keeps
// no statistics (then only plans without workspace fit).
int64_t DefaultGpuWorkspaceBudget(OpKernelContext* ctx) {
  tensorflow::Allocator* a = ctx->device()->GetAllocator(tensorflow::AllocatorAttributes());
  const std::optional<tensorflow::AllocatorStats> stats = a ? a->GetStats() : std::nullopt;
  if (!stats || !stats->bytes_limit) return 0;
  const int64_t free_bytes = std::max<int64_t>(0, *stats->bytes_limit - stats->bytes_in_use);
  return int64_t(double(free_bytes) * kDefaultBudgetFraction);
}

template <typename T>
class BigConvGpuBase : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;

 protected:
  void Run(OpKernelContext* ctx, const ConvProblem& problem, const void* in, const void* filter,
           void* out) {
    const ConvGeometry& g = problem.g;
    if (g.output_elements() == 0) return;
    auto* stream = reinterpret_cast<cudaStream_t>(
        ctx->op_device_context()->stream()->platform_specific_handle().stream);
    const int64_t limit =
        this->workspace_limit_ > 0 ? this->workspace_limit_ : DefaultGpuWorkspaceBudget(ctx);
    gpu::GpuAlgorithmChoice choice;
    OP_REQUIRES_OK(ctx, this->ChooseWithPlan([&](const std::string& requested) {
      return gpu::ChooseGpuAlgorithm(problem, kDType<T>, requested, limit, stream, &choice);
    }));
    VLOG(1) << this->name() << " (GPU): " << AlgorithmName(choice.algorithm) << " ("
            << choice.reason << ")";
    Tensor workspace;
    void* ws = nullptr;
    if (choice.workspace_bytes() > 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                             TensorShape({choice.workspace_bytes()}), &workspace));
      ws = this->Data(&workspace);
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(gpu::RunConvGpu(problem, kDType<T>, choice, in, filter, out,
                                                   ws, stream)));
  }
};

}  // namespace

#define REGISTER(T) TFBIGCONV_REGISTER_OPS(tensorflow::DEVICE_GPU, BigConvGpuBase, T)
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
REGISTER(float)
REGISTER(double)
#undef REGISTER

}  // namespace tfbigconv

#endif  // GOOGLE_CUDA
