// The three ops' kernels, shared by the CPU and GPU builds: attributes,
// validation, output allocation and posing each pass as a ConvProblem. A
// device base class (BigConvDeviceBase<Device, T>, a BigConvOpBase subclass)
// supplies Run(), which executes one ConvProblem on that device.
#pragma once

#include <string>
#include <vector>

#include "attrs.h"
#include "dtypes.h"
#include "geometry.h"
#include "status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfbigconv {

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

inline std::vector<int64_t> Dims(const TensorShape& s) {
  std::vector<int64_t> d(s.dims());
  for (int i = 0; i < s.dims(); ++i) d[i] = s.dim_size(i);
  return d;
}

inline std::string ShapeString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The core's Status as TensorFlow's.
inline absl::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return absl::OkStatus();
    case StatusCode::kInvalidArgument: return tensorflow::errors::InvalidArgument(s.message());
    case StatusCode::kResourceExhausted: return tensorflow::errors::ResourceExhausted(s.message());
    case StatusCode::kUnavailable: return tensorflow::errors::FailedPrecondition(s.message());
    case StatusCode::kInternal: return tensorflow::errors::Internal(s.message());
  }
  return tensorflow::errors::Internal(s.message());
}

// Reads a 4-element int32 sizes tensor (input_sizes / filter_sizes).
inline absl::Status SizesFromTensor(const Tensor& t, const char* name, int rank,
                                    std::vector<int64_t>* out) {
  if (t.dims() != 1 || t.NumElements() != rank)
    return tensorflow::errors::InvalidArgument(name, " must be a 1-D tensor of ", rank,
                                               " sizes, got shape ", t.shape().DebugString());
  auto v = t.flat<int32_t>();
  out->assign(rank, 0);
  for (int i = 0; i < rank; ++i) {
    if (v(i) < 0)
      return tensorflow::errors::InvalidArgument(name, " must be non-negative, got ", v(i));
    (*out)[i] = v(i);
  }
  return absl::OkStatus();
}

// Shared by the three ops: attributes and checks. Subclasses add
//   void Run(OpKernelContext*, const ConvProblem&, const void* input,
//            const void* filter, void* output);
template <typename T>
class BigConvOpBase : public OpKernel {
 public:
  explicit BigConvOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetConvAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, GetAlgorithmAttrs(ctx, &algorithm_, &planned_));
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

  // Runs the device's chooser `choose(requested)`: with "auto", first for the
  // trace-time plan (planned_algorithm) if there is one; if that no longer fits
  // or cannot run here (another budget or device at run time), "auto" decides.
  template <typename Choose>
  absl::Status ChooseWithPlan(Choose choose) const {
    if (algorithm_ == AlgorithmRequest::kAuto && planned_ != AlgorithmRequest::kAuto) {
      const Status s = choose(planned_);
      if (s.ok() || (s.code() != StatusCode::kResourceExhausted &&
                     s.code() != StatusCode::kUnavailable))
        return ToTfStatus(s);
    }
    return ToTfStatus(choose(algorithm_));
  }

  // The tensors' rank: 4, or 5 for the 3-D ops.
  int Rank() const { return 2 + SpatialDims(attrs_.data_format); }

  static const void* Data(const Tensor& t) { return t.tensor_data().data(); }
  static void* Data(Tensor* t) { return const_cast<char*>(t->tensor_data().data()); }

  ConvAttrs attrs_;
  AlgorithmRequest algorithm_ = AlgorithmRequest::kAuto;  // kAuto, kDirect or kFft (the attr's set)
  AlgorithmRequest planned_ = AlgorithmRequest::kAuto;    // kAuto: none; else kDirect or kFft
  int64_t workspace_limit_ = 0;
};

// A device's base class: Run() plans the pass within the workspace limit (the
// workspace_limit_bytes attribute, else the device's default budget), logs the
// choice, takes the workspace from TensorFlow's allocator and launches the pass.
// Device, made per run from the context, supplies the device's part:
//   using Choice;                   its planner's choice (.algorithm, ...)
//   int64_t DefaultBudget() const;  asked only where the attribute is 0
//   Status Choose(const ConvProblem&, DType, AlgorithmRequest requested,
//                 int64_t limit, Choice*) const;
//   static void Log(const std::string& op_name, const Choice&);  (its VLOG)
//   static int64_t WorkspaceBytes(const Choice&);
//   Status Launch(const ConvProblem&, DType, const Choice&, const void* a,
//                 const void* b, void* out, void* workspace) const;
template <typename Device, typename T>
class BigConvDeviceBase : public BigConvOpBase<T> {
 public:
  using BigConvOpBase<T>::BigConvOpBase;

 protected:
  void Run(OpKernelContext* ctx, const ConvProblem& problem, const void* in, const void* filter,
           void* out) {
    if (problem.g.output_elements() == 0) return;
    const Device device(ctx);
    const int64_t limit =
        this->workspace_limit_ > 0 ? this->workspace_limit_ : device.DefaultBudget();
    typename Device::Choice choice;
    OP_REQUIRES_OK(ctx, this->ChooseWithPlan([&](AlgorithmRequest requested) {
      return device.Choose(problem, kDType<T>, requested, limit, &choice);
    }));
    Device::Log(this->name(), choice);
    Tensor workspace;
    void* ws = nullptr;
    const int64_t workspace_bytes = Device::WorkspaceBytes(choice);
    if (workspace_bytes > 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({workspace_bytes}),
                                             &workspace));
      ws = this->Data(&workspace);
    }
    OP_REQUIRES_OK(ctx,
                   ToTfStatus(device.Launch(problem, kDType<T>, choice, in, filter, out, ws)));
  }
};

template <class Base>
class BigConv2DOp : public Base {
 public:
  using Base::Base;
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

template <class Base>
class BigConv2DBackpropInputOp : public Base {
 public:
  using Base::Base;
  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> input_sizes;
    OP_REQUIRES_OK(ctx, SizesFromTensor(ctx->input(0), "input_sizes", this->Rank(), &input_sizes));
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

template <class Base>
class BigConv2DBackpropFilterOp : public Base {
 public:
  using Base::Base;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    std::vector<int64_t> filter_sizes;
    OP_REQUIRES_OK(ctx, SizesFromTensor(ctx->input(1), "filter_sizes", this->Rank(), &filter_sizes));
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

// Registers the three ops PREFIX, PREFIX "BackpropInput" and PREFIX
// "BackpropFilter" ("BigConv2D" or "BigConv3D": the same kernel classes) for
// dtype T on DEVICE with base class BASE<T>.
#define TFBIGCONV_REGISTER_OPS(PREFIX, DEVICE, BASE, T)                                   \
  REGISTER_KERNEL_BUILDER(Name(PREFIX).Device(DEVICE).TypeConstraint<T>("T"),              \
                          ::tfbigconv::BigConv2DOp<BASE<T>>);                              \
  REGISTER_KERNEL_BUILDER(Name(PREFIX "BackpropInput")                                    \
                              .Device(DEVICE)                                             \
                              .TypeConstraint<T>("T")                                     \
                              .HostMemory("input_sizes"),                                 \
                          ::tfbigconv::BigConv2DBackpropInputOp<BASE<T>>);                 \
  REGISTER_KERNEL_BUILDER(Name(PREFIX "BackpropFilter")                                   \
                              .Device(DEVICE)                                             \
                              .TypeConstraint<T>("T")                                     \
                              .HostMemory("filter_sizes"),                                \
                          ::tfbigconv::BigConv2DBackpropFilterOp<BASE<T>>);

// Registers the three ops on DEVICE (tensorflow::DEVICE_CPU, ...) with base
// class BigConvDeviceBase<DEVICE_PART, T> for each dtype T the ops take.
#define TFBIGCONV_REGISTER_DEVICE_OPS(DEVICE, DEVICE_PART)                                 \
  template <typename T>                                                                    \
  using BigConvDeviceBaseOf##DEVICE_PART = ::tfbigconv::BigConvDeviceBase<DEVICE_PART, T>; \
  TFBIGCONV_REGISTER_OPS("BigConv2D", DEVICE, BigConvDeviceBaseOf##DEVICE_PART, Eigen::half) \
  TFBIGCONV_REGISTER_OPS("BigConv2D", DEVICE, BigConvDeviceBaseOf##DEVICE_PART,              \
                         Eigen::bfloat16)                                                     \
  TFBIGCONV_REGISTER_OPS("BigConv2D", DEVICE, BigConvDeviceBaseOf##DEVICE_PART, float)       \
  TFBIGCONV_REGISTER_OPS("BigConv2D", DEVICE, BigConvDeviceBaseOf##DEVICE_PART, double)

}  // namespace tfbigconv
