// GPU kernels of the three ops (built with GOOGLE_CUDA): the ops of
// kernel_base.h, BigConvDeviceBase's Run() with GpuDevice, which plans within
// the allocator's budget and enqueues the pass with gpu::RunConvGpu
// (cuda/run_gpu.h, the launch the harness also tests) on the op's stream. The only file where TF meets the CUDA code.
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

// The GPU's part of BigConvDeviceBase (kernel_base.h): the allocator's
// budget, the GPU planner and gpu::RunConvGpu on the op's stream.
class GpuDevice {
 public:
  using Choice = gpu::GpuAlgorithmChoice;
  explicit GpuDevice(OpKernelContext* ctx)
      : ctx_(ctx),
        stream_(reinterpret_cast<cudaStream_t>(
            ctx->op_device_context()->stream()->platform_specific_handle().stream)) {}
  int64_t DefaultBudget() const { return DefaultGpuWorkspaceBudget(ctx_); }
  Status Choose(const ConvProblem& problem, DType dtype, AlgorithmRequest requested,
                int64_t limit, Choice* choice) const {
    return gpu::ChooseGpuAlgorithm(problem, dtype, requested, limit, stream_, choice);
  }
  static void Log(const std::string& op_name, const Choice& choice) {
    VLOG(1) << op_name << " (GPU): " << AlgorithmName(choice.algorithm) << " (" << choice.reason
            << ")";
  }
  static int64_t WorkspaceBytes(const Choice& choice) { return choice.workspace_bytes(); }
  Status Launch(const ConvProblem& problem, DType dtype, const Choice& choice, const void* a,
                const void* b, void* out, void* workspace) const {
    return gpu::RunConvGpu(problem, dtype, choice, a, b, out, workspace, stream_);
  }

 private:
  OpKernelContext* const ctx_;
  const cudaStream_t stream_;
};

}  // namespace

TFBIGCONV_REGISTER_DEVICE_OPS(tensorflow::DEVICE_GPU, GpuDevice)

}  // namespace tfbigconv

#endif  // GOOGLE_CUDA
