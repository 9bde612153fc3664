// CPU kernels of the three ops: validate, allocate, pose the pass as a
// ConvProblem, and run the chosen algorithm on it.
#include <string>
#include <vector>

#include "attrs.h"
#include "direct_cpu.h"
#include "fft_cpu.h"
#include "geometry.h"
#include "isa.h"
#include "memory_info.h"
#include "plan.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/logging.h"

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

std::string ShapeString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
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

// Reads a 4-element int32 sizes tensor (input_sizes / filter_sizes).
absl::Status SizesFromTensor(const Tensor& t, const char* name, std::vector<int64_t>* out) {
  if (t.dims() != 1 || t.NumElements() != 4)
    return tensorflow::errors::InvalidArgument(name, " must be a 1-D tensor of 4 sizes, got shape ",
                                               t.shape().DebugString());
  auto v = t.flat<int32_t>();
  out->assign(4, 0);
  for (int i = 0; i < 4; ++i) {
    if (v(i) < 0)
      return tensorflow::errors::InvalidArgument(name, " must be non-negative, got ", v(i));
    (*out)[i] = v(i);
  }
  return absl::OkStatus();
}

// Shared by the three ops: attributes, and running one ConvProblem.
template <typename T>
class BigConvOpBase : public OpKernel {
 public:
  explicit BigConvOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetConvAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("algorithm", &algorithm_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("workspace_limit_bytes", &workspace_limit_));
    OP_REQUIRES(ctx, workspace_limit_ >= 0,
                tensorflow::errors::InvalidArgument(
                    "workspace_limit_bytes must be non-negative, got ", workspace_limit_));
  }

 protected:
  // Forward geometry from the input and filter shapes.
  absl::Status Geometry(const std::vector<int64_t>& input_shape,
                        const std::vector<int64_t>& filter_shape, ConvGeometry* g) const {
    const std::string err = ComputeConvGeometry(input_shape, filter_shape, attrs_, g);
    if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
    return absl::OkStatus();
  }

  // out_backprop must have the forward output's shape.
  static absl::Status CheckOutBackprop(const ConvGeometry& g, const Tensor& dy) {
    const std::vector<int64_t> want = g.output_shape();
    if (Dims(dy.shape()) != want)
      return tensorflow::errors::InvalidArgument(
          "out_backprop shape ", dy.shape().DebugString(),
          " does not match the convolution's output shape ", ShapeString(want));
    return absl::OkStatus();
  }

  void Run(OpKernelContext* ctx, const ConvProblem& problem, const void* in, const void* filter,
           void* out) {
    const ConvGeometry& g = problem.g;
    if (g.output_elements() == 0) return;
    const ParallelFor pf = TfParallelFor(ctx);
    const int64_t limit = workspace_limit_ > 0 ? workspace_limit_ : DefaultHostWorkspaceBudget();
    AlgorithmChoice choice;
    const std::string err =
        ChooseAlgorithm(g, kDType<T>, algorithm_, limit, pf.num_workers(), &choice);
    OP_REQUIRES(ctx, err.empty(), tensorflow::errors::ResourceExhausted(err));
    VLOG(1) << name() << ": " << (choice.algorithm == Algorithm::kFft ? "fft" : "direct") << " ("
            << choice.reason << ")";
    if (choice.algorithm == Algorithm::kFft) {
      FftParams p;
      p.problem = problem;
      p.dtype = kDType<T>;
      p.plan = choice.fft_plan;
      Tensor workspace;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8,
                                             TensorShape({p.plan.workspace_bytes}), &workspace));
      p.input = in;
      p.filter = filter;
      p.output = out;
      p.workspace = const_cast<char*>(workspace.tensor_data().data());
      FftConv(p, pf);
    } else {
      DirectParams p;
      p.problem = problem;
      p.dtype = kDType<T>;
      p.input = in;
      p.filter = filter;
      p.output = out;
      DirectConv(p, pf, ActiveIsa());
    }
  }

  static const void* Data(const Tensor& t) { return t.tensor_data().data(); }
  static void* Data(Tensor* t) { return const_cast<char*>(t->tensor_data().data()); }

  ConvAttrs attrs_;
  std::string algorithm_;
  int64_t workspace_limit_ = 0;
};

template <typename T>
class BigConv2DOp : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, this->Geometry(Dims(input.shape()), Dims(filter.shape()), &g));
    TensorShape out_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(g.output_shape(), &out_shape));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &output));
    this->Run(ctx, ForwardProblem(g), this->Data(input), this->Data(filter), this->Data(output));
  }
};

template <typename T>
class BigConv2DBackpropInputOp : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> input_sizes;
    OP_REQUIRES_OK(ctx, SizesFromTensor(ctx->input(0), "input_sizes", &input_sizes));
    const Tensor& filter = ctx->input(1);
    const Tensor& dy = ctx->input(2);
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, this->Geometry(input_sizes, Dims(filter.shape()), &g));
    OP_REQUIRES_OK(ctx, this->CheckOutBackprop(g, dy));
    TensorShape dx_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(input_sizes, &dx_shape));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dx_shape, &dx));
    this->Run(ctx, BackpropInputProblem(g), this->Data(dy), this->Data(filter), this->Data(dx));
  }
};

template <typename T>
class BigConv2DBackpropFilterOp : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    std::vector<int64_t> filter_sizes;
    OP_REQUIRES_OK(ctx, SizesFromTensor(ctx->input(1), "filter_sizes", &filter_sizes));
    const Tensor& dy = ctx->input(2);
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, this->Geometry(Dims(input.shape()), filter_sizes, &g));
    OP_REQUIRES_OK(ctx, this->CheckOutBackprop(g, dy));
    TensorShape dw_shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(filter_sizes, &dw_shape));
    Tensor* dw = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dw_shape, &dw));
    if (dw->NumElements() == 0) return;
    this->Run(ctx, BackpropFilterProblem(g), this->Data(input), this->Data(dy), this->Data(dw));
  }
};

#define REGISTER(T)                                                                          \
  REGISTER_KERNEL_BUILDER(                                                                   \
      Name("BigConv2D").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),                \
      BigConv2DOp<T>);                                                                       \
  REGISTER_KERNEL_BUILDER(Name("BigConv2DBackpropInput")                                     \
                              .Device(tensorflow::DEVICE_CPU)                                \
                              .TypeConstraint<T>("T")                                        \
                              .HostMemory("input_sizes"),                                    \
                          BigConv2DBackpropInputOp<T>);                                      \
  REGISTER_KERNEL_BUILDER(Name("BigConv2DBackpropFilter")                                    \
                              .Device(tensorflow::DEVICE_CPU)                                \
                              .TypeConstraint<T>("T")                                        \
                              .HostMemory("filter_sizes"),                                   \
                          BigConv2DBackpropFilterOp<T>);
REGISTER(Eigen::half)
REGISTER(Eigen::bfloat16)
REGISTER(float)
REGISTER(double)
#undef REGISTER

}  // namespace
}  // namespace tfbigconv
