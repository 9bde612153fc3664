// CPU kernels: validate, allocate, fill a plain params struct, call the core.
#include <string>
#include <vector>

#include "attrs.h"
#include "direct_cpu.h"
#include "fft_cpu.h"
#include "memory_info.h"
#include "plan.h"
#include "geometry.h"
#include "isa.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfbigconv {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

template <typename T> constexpr DType kDType = DType::kFloat;
template <> constexpr DType kDType<double> = DType::kDouble;
template <> constexpr DType kDType<Eigen::half> = DType::kHalf;
template <> constexpr DType kDType<Eigen::bfloat16> = DType::kBFloat16;
static_assert(sizeof(Eigen::half) == sizeof(f16) && sizeof(Eigen::bfloat16) == sizeof(bf16),
              "16-bit float layouts must match");

std::vector<int64_t> Dims(const TensorShape& s) {
  std::vector<int64_t> d(s.dims());
  for (int i = 0; i < s.dims(); ++i) d[i] = s.dim_size(i);
  return d;
}

// The intra-op pool; ids 0..NumThreads() (the caller may run a block too).
ParallelFor TfParallelFor(OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  const int threads = pool->NumThreads();
  return ParallelFor(threads + 1, [pool, threads](int64_t total, const ParallelFor::Body& body) {
    // Equal blocks, one per pool thread: more shards than cores would put the
    // caller thread on a core too and make the threads evict each other's L2.
    const int64_t block = std::max<int64_t>(1, (total + threads - 1) / threads);
    pool->ParallelForWithWorkerId(
        total, tsl::thread::ThreadPool::SchedulingParams::Fixed(block),
        [&body](int64_t begin, int64_t end, int id) { body(begin, end, id); });
  });
}

template <typename T>
class BigConv2DOp : public OpKernel {
 public:
  explicit BigConv2DOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetConvAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("algorithm", &algorithm_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("workspace_limit_bytes", &workspace_limit_));
    OP_REQUIRES(ctx, workspace_limit_ >= 0,
                tensorflow::errors::InvalidArgument("workspace_limit_bytes must be non-negative, got ",
                                                    workspace_limit_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    ConvGeometry g;
    const std::string err =
        ComputeConvGeometry(Dims(input.shape()), Dims(filter.shape()), attrs_, &g);
    OP_REQUIRES(ctx, err.empty(), tensorflow::errors::InvalidArgument(err));
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(g.output_shape(), &out_shape));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &output));
    if (output->NumElements() == 0) return;
    const void* in = input.tensor_data().data();
    const void* f = filter.tensor_data().data();
    void* out = const_cast<char*>(output->tensor_data().data());
    const ParallelFor pf = TfParallelFor(ctx);
    if (algorithm_ == "fft") {
      FftForwardParams p;
      p.g = g;
      p.dtype = kDType<T>;
      const int64_t limit = workspace_limit_ > 0 ? workspace_limit_ : DefaultHostWorkspaceBudget();
      const std::string plan_err = PlanFftForward(g, p.dtype, limit, pf.num_workers(), &p.plan);
      OP_REQUIRES(ctx, plan_err.empty(), tensorflow::errors::ResourceExhausted(plan_err));
      Tensor workspace;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                             TensorShape({p.plan.workspace_bytes}), &workspace));
      p.input = in;
      p.filter = f;
      p.output = out;
      p.workspace = const_cast<char*>(workspace.tensor_data().data());
      FftForward(p, pf);
      return;
    }
    DirectForwardParams p;  // "direct", and for now "auto"
    p.g = g;
    p.dtype = kDType<T>;
    p.input = in;
    p.filter = f;
    p.output = out;
    DirectForward(p, pf, ActiveIsa());
  }

 private:
  ConvAttrs attrs_;
  std::string algorithm_;
  int64_t workspace_limit_ = 0;
};

#define REGISTER(T)                                                                   \
  REGISTER_KERNEL_BUILDER(                                                            \
      Name("BigConv2D").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),         \
      BigConv2DOp<T>);
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
REGISTER(float)
REGISTER(double)
#undef REGISTER

}  // namespace
}  // namespace tfbigconv
