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

// The CPU's part of BigConvDeviceBase (kernel_base.h): the host budget, the
// planner and RunConvCpu on TF's intra-op pool.
class CpuDevice {
 public:
  using Choice = AlgorithmChoice;
  explicit CpuDevice(OpKernelContext* ctx) : pf_(TfParallelFor(ctx)) {}
  int64_t DefaultBudget() const { return DefaultHostWorkspaceBudget(); }
  Status Choose(const ConvProblem& problem, DType dtype, const std::string& requested,
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

}  // namespace

TFBIGCONV_REGISTER_DEVICE_OPS(tensorflow::DEVICE_CPU, CpuDevice)
// The 3-D ops: CPU only for now.
#define TFBIGCONV_REGISTER_CPU_OPS_3D(T) \
  TFBIGCONV_REGISTER_OPS("BigConv3D", tensorflow::DEVICE_CPU, BigConvDeviceBaseOfCpuDevice, T)
TFBIGCONV_REGISTER_CPU_OPS_3D(Eigen::half)
TFBIGCONV_REGISTER_CPU_OPS_3D(Eigen::bfloat16)
TFBIGCONV_REGISTER_CPU_OPS_3D(float)
TFBIGCONV_REGISTER_CPU_OPS_3D(double)

}  // namespace tfbigconv
