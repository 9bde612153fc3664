// Op interfaces and shape functions. Shape math comes from core/geometry.
#include <string>
#include <vector>

#include "attrs.h"
#include "geometry.h"
#include "plan.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfbigconv {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

absl::Status RequireRank(InferenceContext* c, ShapeHandle s, const char* name, int rank) {
  if (c->RankKnown(s) && c->Rank(s) != rank)
    return tensorflow::errors::InvalidArgument(name, " must be rank ", rank, ", got rank ",
                                               c->Rank(s), ": shape ", c->DebugString(s));
  return absl::OkStatus();
}

// Output shape of a convolution from (possibly partially known) input and
// filter shapes. Known dimensions are validated by ComputeConvGeometry.
absl::Status ConvOutputShape(InferenceContext* c, ShapeHandle input, ShapeHandle filter,
                             ShapeHandle* out) {
  ConvAttrs a;
  TF_RETURN_IF_ERROR(GetConvAttrs(c, &a));
  const int spatial = SpatialDims(a.data_format), rank = 2 + spatial;
  TF_RETURN_IF_ERROR(RequireRank(c, input, "input", rank));
  TF_RETURN_IF_ERROR(RequireRank(c, filter, "filter", rank));
  TF_RETURN_IF_ERROR(c->WithRank(input, rank, &input));
  TF_RETURN_IF_ERROR(c->WithRank(filter, rank, &filter));
  // Spatial dimensions in data_format order, then the channel dimension.
  const int first = ChannelsLast(a.data_format) ? 1 : 2;
  const int ci = ChannelsLast(a.data_format) ? rank - 1 : 1;
  std::vector<int64_t> in_dims(rank), f_dims(rank);
  bool all_known = true;
  for (int i = 0; i < rank; ++i) {
    in_dims[i] = c->Value(c->Dim(input, i));
    f_dims[i] = c->Value(c->Dim(filter, i));
    all_known = all_known && in_dims[i] >= 0 && f_dims[i] >= 0;
  }
  std::vector<DimensionHandle> o(rank);
  if (all_known) {
    ConvGeometry g;
    const std::string err = ComputeConvGeometry(in_dims, f_dims, a, &g);
    if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
    const std::vector<int64_t> s = g.output_shape();
    for (int i = 0; i < rank; ++i) o[i] = c->MakeDim(s[i]);
  } else {
    // Each known spatial pair still gets its size (and its checks).
    int64_t sizes[3] = {-1, -1, -1};
    int idx[3];
    for (int k = 0; k < spatial; ++k) idx[k] = first + k;
    const char* const names2[2] = {"height", "width"};
    const char* const names3[3] = {"depth", "height", "width"};
    const char* const* names = spatial == 3 ? names3 : names2;
    for (int k = 0; k < spatial; ++k) {
      const int64_t in = in_dims[idx[k]], f = f_dims[k];
      if (in < 0 || f < 0) continue;
      const bool ex = a.padding == Padding::kExplicit;
      const std::string err = ComputeOutputSize(
          in, f, a.strides[idx[k]], a.dilations[idx[k]], a.padding,
          ex ? a.explicit_paddings[2 * idx[k]] : 0, ex ? a.explicit_paddings[2 * idx[k] + 1] : 0,
          names[k], &sizes[k], nullptr, nullptr);
      if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
    }
    const int64_t in_c = in_dims[ci], f_in = f_dims[spatial], f_out = f_dims[spatial + 1];
    if (in_c >= 0 && f_in > 0 && in_c % f_in != 0)
      return tensorflow::errors::InvalidArgument("input depth ", in_c,
                                                 " must be a multiple of the filter's in_depth ",
                                                 f_in);
    if (in_c > 0 && f_in > 0 && f_out >= 0 && in_c % f_in == 0 && f_out % (in_c / f_in) != 0)
      return tensorflow::errors::InvalidArgument("filter out_depth ", f_out,
                                                 " must be a multiple of groups ", in_c / f_in);
    o[0] = c->Dim(input, 0);
    for (int k = 0; k < spatial; ++k)
      o[idx[k]] = sizes[k] >= 0 ? c->MakeDim(sizes[k]) : c->UnknownDim();
    o[ci] = c->Dim(filter, spatial + 1);
  }
  *out = c->MakeShape(o);
  return absl::OkStatus();
}

// Shape given by an int32 sizes input (input_sizes/filter_sizes) of 4
// elements (5 for the 3-D ops).
absl::Status ShapeFromSizes(InferenceContext* c, int sizes_input, const char* name,
                            ShapeHandle* out) {
  ConvAttrs a;
  TF_RETURN_IF_ERROR(GetConvAttrs(c, &a));
  const int rank = 2 + SpatialDims(a.data_format);
  ShapeHandle sizes = c->input(sizes_input);
  if (c->RankKnown(sizes) && c->Rank(sizes) != 1)
    return tensorflow::errors::InvalidArgument(name, " must be a 1-D tensor of ", rank, " sizes");
  if (c->RankKnown(sizes) && c->ValueKnown(c->Dim(sizes, 0)) &&
      c->Value(c->Dim(sizes, 0)) != rank)
    return tensorflow::errors::InvalidArgument(name, " must have ", rank, " elements, got ",
                                               c->Value(c->Dim(sizes, 0)));
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(sizes_input, out));
  return c->WithRank(*out, rank, out);
}

// The shape functions of the three ops of either rank: the forward output, and
// the gradients' outputs from their input_sizes / filter_sizes inputs.
absl::Status ForwardShapeFn(InferenceContext* c) {
  ShapeHandle out;
  TF_RETURN_IF_ERROR(ConvOutputShape(c, c->input(0), c->input(1), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}
// kIndex 0: BackpropInput's input_sizes; 1: BackpropFilter's filter_sizes.
template <int kIndex>
absl::Status SizesShapeFn(InferenceContext* c) {
  ShapeHandle out;
  TF_RETURN_IF_ERROR(ShapeFromSizes(c, kIndex, kIndex == 0 ? "input_sizes" : "filter_sizes", &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

}  // namespace
}  // namespace tfbigconv

// Attributes shared by every BigConv2D* and BigConv3D* op (docs/ARCHITECTURE.md
// section 3): the same but for the data formats and the dilations' default.
#define TFBIGCONV_CONV_ATTRS(DATA_FORMAT, DILATIONS)                 \
  Attr("T: {half, bfloat16, float, double}")                       \
      .Attr("strides: list(int)")                                  \
      .Attr("padding: {'SAME', 'VALID', 'EXPLICIT'}")              \
      .Attr("explicit_paddings: list(int) = []")                   \
      .Attr(DATA_FORMAT)                                           \
      .Attr(DILATIONS)                                             \
      .Attr("algorithm: {'auto', 'direct', 'fft'} = 'auto'")       \
      .Attr("planned_algorithm: {'none', 'direct', 'fft'} = 'none'") \
      .Attr("workspace_limit_bytes: int = 0")
#define TFBIGCONV_CONV2D_ATTRS                                   \
  TFBIGCONV_CONV_ATTRS("data_format: {'NHWC', 'NCHW'} = 'NHWC'", \
                       "dilations: list(int) = [1, 1, 1, 1]")
#define TFBIGCONV_CONV3D_ATTRS                                      \
  TFBIGCONV_CONV_ATTRS("data_format: {'NDHWC', 'NCDHW'} = 'NDHWC'", \
                       "dilations: list(int) = [1, 1, 1, 1, 1]")

REGISTER_OP("BigConv2D")
    .Input("input: T")
    .Input("filter: T")
    .Output("output: T")
    .TFBIGCONV_CONV2D_ATTRS
    .SetShapeFn(tfbigconv::ForwardShapeFn)
    .Doc(R"doc(
2-D convolution with tf.nn.conv2d's semantics (groups, explicit padding,
NCHW, dilations), computed without im2col. filter is [H, W, in_depth/groups,
out_depth]. algorithm: 'direct' (tiled direct convolution), 'fft'
(overlap-save FFT convolution) or 'auto' (the faster by estimate).
planned_algorithm: with 'auto', the trace-time planner's (possibly measured)
choice for this pass; 'none' leaves it to the kernel at run time. Gradients
see 'auto' and plan their own passes.
workspace_limit_bytes: 0 means half of the free host memory.
)doc");

REGISTER_OP("BigConv2DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("output: T")
    .TFBIGCONV_CONV2D_ATTRS
    .SetShapeFn(tfbigconv::SizesShapeFn<0>)
    .Doc(R"doc(
Gradient of BigConv2D with respect to its input: a transposed convolution
computed in gather form (no scatter, no atomics). Same attributes as BigConv2D.
)doc");

REGISTER_OP("BigConv2DBackpropFilter")
    .Input("input: T")
    .Input("filter_sizes: int32")
    .Input("out_backprop: T")
    .Output("output: T")
    .TFBIGCONV_CONV2D_ATTRS
    .SetShapeFn(tfbigconv::SizesShapeFn<1>)
    .Doc(R"doc(
Gradient of BigConv2D with respect to its filter: a reduction over batch and
output pixels for every tap, in a fixed order (deterministic). Same attributes
as BigConv2D.
)doc");

REGISTER_OP("BigConv2DBackprop")
    .Input("input: T")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("input_backprop: T")
    .Output("filter_backprop: T")
    .TFBIGCONV_CONV2D_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(1));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Both gradients of BigConv2D, with respect to its input and its filter, in
one op. For a 1-D depthwise convolution (height 1, one output per channel, at
least 8 channels) each image's out_backprop is transformed once for both
(the fused FFT backward); other cases, or a plan beyond the workspace limit,
run the two gradients as BigConv2DBackpropInput and BigConv2DBackpropFilter
do. CPU only. Same attributes as BigConv2D.
)doc");

// The 3-D ops: the same in NDHWC/NCDHW with DHWIO filters and the same kernels
// (the core is 3-D); CPU only for now.
REGISTER_OP("BigConv3D")
    .Input("input: T")
    .Input("filter: T")
    .Output("output: T")
    .TFBIGCONV_CONV3D_ATTRS
    .SetShapeFn(tfbigconv::ForwardShapeFn)
    .Doc(R"doc(
3-D convolution with tf.nn.conv3d's semantics plus groups, explicit padding,
NCDHW and dilations, computed without im2col: BigConv2D's attributes in 3-D.
filter is [D, H, W, in_depth/groups, out_depth].
)doc");

REGISTER_OP("BigConv3DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("output: T")
    .TFBIGCONV_CONV3D_ATTRS
    .SetShapeFn(tfbigconv::SizesShapeFn<0>)
    .Doc(R"doc(
Gradient of BigConv3D with respect to its input. Same attributes as BigConv3D.
)doc");

REGISTER_OP("BigConv3DBackpropFilter")
    .Input("input: T")
    .Input("filter_sizes: int32")
    .Input("out_backprop: T")
    .Output("output: T")
    .TFBIGCONV_CONV3D_ATTRS
    .SetShapeFn(tfbigconv::SizesShapeFn<1>)
    .Doc(R"doc(
Gradient of BigConv3D with respect to its filter (deterministic). Same
attributes as BigConv3D.
)doc");

// Lets Python set the planner's cost model in this library, which it loads
// through TF rather than pybind11 (see tfbigconv/cost_model.py): values in
// CostModelFields() order. Returns 0 on success; Python validates the values
// through _core first. Defined here, not in the core library, because the
// link hides the static libraries' symbols.
extern "C" __attribute__((visibility("default"))) int tfbigconv_set_cost_model(const double* values,
                                                                              int count) {
  if (count < 0) return 1;
  return tfbigconv::SetActiveCostModelValues(std::vector<double>(values, values + count)).empty()
             ? 0
             : 1;
}
