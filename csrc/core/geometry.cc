#include "geometry.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "checked_math.h"

namespace tfbigconv {
namespace {

// The widest element (float64): size checks hold for every dtype.
constexpr int64_t kMaxElementBytes = 8;

std::string ListToString(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Index of each spatial axis (kD, kH, kW; depth -1 in 2-D) and of C in
// data_format order.
struct DimIndex {
  int axis[kSpatialAxes];
  int c;
};
DimIndex Dims(DataFormat f) {
  switch (f) {
    case DataFormat::kNHWC: return {{-1, 1, 2}, 3};
    case DataFormat::kNCHW: return {{-1, 2, 3}, 1};
    case DataFormat::kNDHWC: return {{1, 2, 3}, 4};
    case DataFormat::kNCDHW: return {{2, 3, 4}, 1};
  }
  return {{-1, 1, 2}, 3};
}

const char* const kAxisNames[kSpatialAxes] = {"depth", "height", "width"};

const char* FormatName(DataFormat f) {
  static const char* const kNames[] = {"NHWC", "NCHW", "NDHWC", "NCDHW"};
  return kNames[int(f)];
}

}  // namespace

namespace {
ImageStrides Strides(DataFormat f, int64_t d, int64_t h, int64_t w, int64_t c) {
  if (ChannelsLast(f)) return {d * h * w * c, h * w * c, w * c, c, 1};
  return {c * d * h * w, h * w, w, 1, d * h * w};
}
}  // namespace

ImageStrides ConvGeometry::input_strides() const {
  return Strides(data_format, in[kD], in[kH], in[kW], in_c);
}

ImageStrides ConvGeometry::output_strides() const {
  return Strides(data_format, out[kD], out[kH], out[kW], out_c);
}

std::vector<int64_t> ConvGeometry::output_shape() const {
  const DimIndex d = Dims(data_format);
  std::vector<int64_t> shape(2 + SpatialDims(data_format));
  shape[0] = batch;
  shape[d.c] = out_c;
  for (int a = 0; a < kSpatialAxes; ++a)
    if (d.axis[a] >= 0) shape[d.axis[a]] = out[a];
  return shape;
}

namespace {
TensorView GroupedView(const ImageStrides& s, int64_t channels_per_group) {
  return {s.n, s.h, s.w, s.c * channels_per_group, s.c, s.d};
}
}  // namespace

const char* PassName(Pass p) {
  static const char* const kNames[] = {"forward", "backprop_input", "backprop_filter"};
  return kNames[int(p)];
}

ConvProblem ForwardProblem(const ConvGeometry& g) {
  ConvProblem p;
  p.pass = Pass::kForward;
  p.g = g;
  p.in = GroupedView(g.input_strides(), g.in_c_per_group());
  p.out = GroupedView(g.output_strides(), g.out_c_per_group());
  const int64_t cig = g.in_c_per_group(), co = g.out_c;
  p.filter = {0, g.filter[kW] * cig * co, cig * co, co, g.out_c_per_group(), 1,
              g.filter[kH] * g.filter[kW] * cig * co};
  return p;
}

ConvProblem BackpropInputProblem(const ConvGeometry& f) {
  const ConvProblem fwd = ForwardProblem(f);
  ConvProblem p;
  p.pass = Pass::kBackpropInput;
  ConvGeometry& g = p.g;
  g = f;
  g.in_c = f.out_c;
  g.filter_in_c = f.out_c_per_group();
  g.out_c = f.in_c;
  for (int a = 0; a < kSpatialAxes; ++a) {
    g.in[a] = f.out[a];
    g.out[a] = f.in[a];
    g.stride[a] = 1;
    g.in_dilation[a] = f.stride[a];
    // Full correlation with the flipped filter, less the forward padding.
    g.pad_before[a] = f.effective_filter(a) - 1 - f.pad_before[a];
    g.pad_after[a] = (g.out[a] - 1) + f.effective_filter(a) - g.virtual_in(a) - g.pad_before[a];
  }
  p.in = fwd.out;
  p.out = fwd.in;
  // Flip every spatial axis; swap the in/out channel strides.
  const FilterView& w = fwd.filter;
  p.filter = {(f.filter[kD] - 1) * w.d + (f.filter[kH] - 1) * w.h + (f.filter[kW] - 1) * w.w,
              -w.h, -w.w, w.o, w.g, w.i, -w.d};
  return p;
}

ConvProblem BackpropFilterProblem(const ConvGeometry& f) {
  const ConvProblem fwd = ForwardProblem(f);
  ConvProblem p;
  p.pass = Pass::kBackpropFilter;
  ConvGeometry& g = p.g;
  g = f;
  g.batch = f.in_c_per_group();
  g.in_c = f.groups * f.batch;
  g.filter_in_c = f.batch;
  for (int a = 0; a < kSpatialAxes; ++a) {
    g.filter[a] = f.out[a];
    g.stride[a] = f.dilation[a];
    g.dilation[a] = f.stride[a];
    g.out[a] = f.filter[a];
    g.pad_after[a] =
        (g.out[a] - 1) * g.stride[a] + g.effective_filter(a) - f.in[a] - g.pad_before[a];
  }
  // Input: batch <- channel within group, channel <- batch.
  p.in = {fwd.in.c, fwd.in.h, fwd.in.w, fwd.in.g, fwd.in.n, fwd.in.d};
  // Filter <- dL/doutput: (oh, ow, n, group, co within group, od).
  p.filter = {0, fwd.out.h, fwd.out.w, fwd.out.n, fwd.out.g, fwd.out.c, fwd.out.d};
  // Output <- dL/dfilter, (D)HWIO: (ci within group, kh, kw, group, co within group, kd).
  const FilterView& w = fwd.filter;
  p.out = {w.i, w.h, w.w, w.g, w.o, w.d};
  return p;
}

ConvProblem PassProblem(const ConvGeometry& g, Pass pass) {
  switch (pass) {
    case Pass::kForward: return ForwardProblem(g);
    case Pass::kBackpropInput: return BackpropInputProblem(g);
    case Pass::kBackpropFilter: return BackpropFilterProblem(g);
  }
  return ForwardProblem(g);
}

std::string ParsePadding(const std::string& s, Padding* out) {
  if (s == "SAME") *out = Padding::kSame;
  else if (s == "VALID") *out = Padding::kValid;
  else if (s == "EXPLICIT") *out = Padding::kExplicit;
  else return "padding must be one of 'SAME', 'VALID' or 'EXPLICIT', got '" + s + "'";
  return "";
}

std::string ParseDataFormat(const std::string& s, DataFormat* out) {
  if (s == "NHWC") *out = DataFormat::kNHWC;
  else if (s == "NCHW") *out = DataFormat::kNCHW;
  else if (s == "NDHWC") *out = DataFormat::kNDHWC;
  else if (s == "NCDHW") *out = DataFormat::kNCDHW;
  else return "data_format must be 'NHWC', 'NCHW', 'NDHWC' or 'NCDHW', got '" + s + "'";
  return "";
}

std::string ValidateAttrs(const ConvAttrs& a) {
  const DimIndex d = Dims(a.data_format);
  const char* fmt = FormatName(a.data_format);
  const size_t rank = 2 + SpatialDims(a.data_format);
  for (int which = 0; which < 2; ++which) {
    const std::vector<int64_t>& v = which == 0 ? a.strides : a.dilations;
    const char* name = which == 0 ? "strides" : "dilations";
    if (v.size() != rank)
      return std::string(name) + " must have " + std::to_string(rank) +
             " elements (one per dimension of " + fmt + "), got " + std::to_string(v.size()) +
             ": " + ListToString(v);
    for (int64_t x : v)
      if (x <= 0) return std::string(name) + " must be positive, got " + ListToString(v);
    if (v[0] != 1 || v[d.c] != 1)
      return std::string(name) + " on the batch and depth dimensions must be 1, got " +
             ListToString(v) + " for data_format " + fmt;
  }
  if (a.padding == Padding::kExplicit) {
    const auto& p = a.explicit_paddings;
    if (p.size() != 2 * rank)
      return "explicit_paddings must have " + std::to_string(2 * rank) +
             " elements (before and after for each of the " + std::to_string(rank) +
             " dimensions) when padding is 'EXPLICIT', got " + std::to_string(p.size()) + ": " +
             ListToString(p);
    for (int64_t x : p)
      if (x < 0) return "explicit_paddings must be non-negative, got " + ListToString(p);
    if (p[0] != 0 || p[1] != 0 || p[2 * d.c] != 0 || p[2 * d.c + 1] != 0)
      return "explicit_paddings on the batch and depth dimensions must be 0, got " +
             ListToString(p) + " for data_format " + fmt;
  } else if (!a.explicit_paddings.empty()) {
    return "explicit_paddings must be empty unless padding is 'EXPLICIT', got " +
           ListToString(a.explicit_paddings);
  }
  return "";
}

std::string ComputeOutputSize(int64_t in, int64_t filter, int64_t stride,
                              int64_t dilation, Padding padding,
                              int64_t pad_before, int64_t pad_after,
                              const char* dim, int64_t* out,
                              int64_t* out_pad_before, int64_t* out_pad_after) {
  if (stride <= 0 || dilation <= 0)
    return std::string("strides and dilations must be positive along ") + dim;
  if (in < 0 || filter < 0 || pad_before < 0 || pad_after < 0)
    return std::string("sizes and paddings must be non-negative along ") + dim;
  if (MulOverflows(filter - 1 < 0 ? 0 : filter - 1, dilation) ||
      AddOverflows((filter - 1 < 0 ? 0 : filter - 1) * dilation, 1))
    return std::string("filter size times dilation overflows 64-bit integers along ") + dim;
  const int64_t eff = (filter - 1) * dilation + 1;
  switch (padding) {
    case Padding::kValid:
      pad_before = pad_after = 0;
      break;
    case Padding::kSame: {
      const int64_t o = in == 0 ? 0 : (in - 1) / stride + 1;  // ceil(in / stride)
      // (o - 1) * stride < in, so the total fits whenever eff does.
      const int64_t total = std::max<int64_t>(0, (o - 1) * stride - in + eff);
      pad_before = total / 2;
      pad_after = total - pad_before;
      break;
    }
    case Padding::kExplicit:
      break;
  }
  if (AddOverflows(in, pad_before) || AddOverflows(in + pad_before, pad_after)) {
    std::ostringstream os;
    os << "padded input size overflows 64-bit integers along " << dim << ": input " << in
       << ", padding " << pad_before << "+" << pad_after;
    return os.str();
  }
  const int64_t padded = in + pad_before + pad_after;
  // tf.nn.conv2d's rule (GetWindowedOutputSize): (padded - eff + stride) / stride,
  // rounded toward zero, may be 0 (an empty output, e.g. an empty input) but
  // not negative. Written so that nothing overflows.
  const int64_t diff = padded - eff;  // both non-negative: no overflow
  const int64_t o = diff >= 0 ? diff / stride + 1 : (diff + stride) / stride;
  if (o < 0) {
    std::ostringstream os;
    os << "filter is larger than the padded input along " << dim
       << ": effective filter size " << eff << " (filter " << filter << ", dilation "
       << dilation << ") > padded input size " << padded << " (input " << in
       << ", padding " << pad_before << "+" << pad_after << ")";
    return os.str();
  }
  *out = o;
  if (out_pad_before) *out_pad_before = pad_before;
  if (out_pad_after) *out_pad_after = pad_after;
  return "";
}

std::string ComputeConvGeometry(const std::vector<int64_t>& in,
                                const std::vector<int64_t>& f,
                                const ConvAttrs& a, ConvGeometry* g) {
  const size_t rank = 2 + SpatialDims(a.data_format);
  const bool three = rank == 5;
  if (in.size() != rank)
    return "input must be rank " + std::to_string(rank) + ", got rank " +
           std::to_string(in.size()) + ": shape " + ListToString(in);
  if (f.size() != rank)
    return std::string("filter must be rank ") + std::to_string(rank) +
           (three ? " [depth, height, width, in_depth/groups, out_depth]"
                  : " [height, width, in_depth/groups, out_depth]") +
           ", got rank " + std::to_string(f.size()) + ": shape " + ListToString(f);
  for (int64_t x : in)
    if (x < 0) return "input shape must be non-negative, got " + ListToString(in);
  for (int64_t x : f)
    if (x < 0) return "filter shape must be non-negative, got " + ListToString(f);
  std::string err = ValidateAttrs(a);
  if (!err.empty()) return err;

  const DimIndex d = Dims(a.data_format);
  // The spatial axes the format has: kD in 3-D, kH in 2-D, to kW; the filter
  // holds them first, in that order.
  const int first = kSpatialAxes - SpatialDims(a.data_format);
  ConvGeometry r;
  r.data_format = a.data_format;
  r.batch = in[0];
  r.in_c = in[d.c];
  for (int ax = first; ax < kSpatialAxes; ++ax) {
    r.in[ax] = in[d.axis[ax]];
    r.filter[ax] = f[ax - first];
  }
  const int fo = three ? 1 : 0;  // the filter's first H dimension
  r.filter_in_c = f[fo + 2];
  r.out_c = f[fo + 3];
  if (r.filter[kD] < 1 || r.filter[kH] < 1 || r.filter[kW] < 1)
    return std::string(three ? "filter depth, height and width" : "filter height and width") +
           " must be at least 1, got filter shape " + ListToString(f);
  if (r.filter_in_c < 1)
    return "filter in_depth (dimension " + std::to_string(fo + 2) +
           ") must be at least 1, got filter shape " + ListToString(f);
  if (r.in_c % r.filter_in_c != 0)
    return "input depth " + std::to_string(r.in_c) +
           " must be a multiple of the filter's in_depth " + std::to_string(r.filter_in_c) +
           " (groups = input depth / filter in_depth); input shape " + ListToString(in) +
           ", filter shape " + ListToString(f);
  r.groups = r.in_c / r.filter_in_c;
  if (r.groups == 0)
    return "input depth must be at least the filter's in_depth " +
           std::to_string(r.filter_in_c) + ", got input shape " + ListToString(in);
  if (r.out_c % r.groups != 0)
    return "filter out_depth " + std::to_string(r.out_c) + " must be a multiple of groups " +
           std::to_string(r.groups) + " (input depth " + std::to_string(r.in_c) +
           " / filter in_depth " + std::to_string(r.filter_in_c) + ")";
  const auto& p = a.explicit_paddings;
  const bool ex = a.padding == Padding::kExplicit;
  for (int ax = first; ax < kSpatialAxes; ++ax) {
    const int i = d.axis[ax];
    r.stride[ax] = a.strides[i];
    r.dilation[ax] = a.dilations[i];
    err = ComputeOutputSize(r.in[ax], r.filter[ax], r.stride[ax], r.dilation[ax], a.padding,
                            ex ? p[2 * i] : 0, ex ? p[2 * i + 1] : 0, kAxisNames[ax], &r.out[ax],
                            &r.pad_before[ax], &r.pad_after[ax]);
    if (!err.empty()) return err;
  }
  // Every later index and size computation is int64; make sure the products
  // fit: each tensor's size in bytes at the widest dtype, and the
  // multiply-adds of the forward and the backprop_input pass (the larger of
  // the gradients: it runs over the input's pixels).
  const struct {
    const char* what;
    std::vector<int64_t> factors;
  } products[] = {
      {"the input's size in bytes",
       {r.batch, r.in[kD], r.in[kH], r.in[kW], r.in_c, kMaxElementBytes}},
      {"the output's size in bytes",
       {r.batch, r.out[kD], r.out[kH], r.out[kW], r.out_c, kMaxElementBytes}},
      {"the filter's size in bytes",
       {r.filter[kD], r.filter[kH], r.filter[kW], r.filter_in_c, r.out_c, kMaxElementBytes}},
      {"the forward pass's multiply-adds",
       {r.batch, r.out[kD], r.out[kH], r.out[kW], r.out_c, r.filter[kD], r.filter[kH], r.filter[kW],
        r.filter_in_c, 2}},
      {"the input gradient's multiply-adds",
       {r.batch, r.in[kD], r.in[kH], r.in[kW], r.in_c, r.filter[kD], r.filter[kH], r.filter[kW],
        r.out_c_per_group(), 2}},
  };
  for (const auto& p : products) {
    int64_t unused;
    if (!CheckedProduct(p.factors, &unused))
      return std::string("tensor sizes overflow 64-bit indexing: ") + p.what +
             " overflows 64-bit integers (input shape " + ListToString(in) + ", filter shape " +
             ListToString(f) + ", output " + std::to_string(r.out[kH]) + "x" +
             std::to_string(r.out[kW]) + ")";
  }
  *g = r;
  return "";
}

}  // namespace tfbigconv
