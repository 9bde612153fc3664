// ConvGeometry: the single place where tf.nn.conv2d's (and tf.nn.conv3d's) shape
// semantics live. The core is 3-D: a 2-D problem has a depth of 1.
// Framework-free: the TF shape function, the kernels and Python (via _core)
// all call into this file. Errors are returned as strings that name the
// offending argument; an empty string means success.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tfbigconv {

enum class Padding { kSame, kValid, kExplicit };
// Channels last or first, of a 4-D (2-D convolution) or 5-D (3-D) tensor.
enum class DataFormat { kNHWC, kNCHW, kNDHWC, kNCDHW };
inline bool ChannelsLast(DataFormat f) { return f == DataFormat::kNHWC || f == DataFormat::kNDHWC; }
inline int SpatialDims(DataFormat f) {
  return f == DataFormat::kNDHWC || f == DataFormat::kNCDHW ? 3 : 2;
}

// Attributes exactly as the op (and tf.nn.conv2d / conv3d) receives them:
// strides and dilations have 4 (5 in 3-D) entries in data_format order;
// explicit_paddings has 8 (10) entries (before/after for each dimension,
// data_format order).
struct ConvAttrs {
  std::vector<int64_t> strides{1, 1, 1, 1};
  std::vector<int64_t> dilations{1, 1, 1, 1};
  Padding padding = Padding::kValid;
  std::vector<int64_t> explicit_paddings;
  DataFormat data_format = DataFormat::kNHWC;
};

// Element strides of an image tensor addressed by logical (n, d, h, w, c).
struct ImageStrides {
  int64_t n, d, h, w, c;
};

// How a kernel addresses its operands: element strides of an image tensor by
// (n, h, w, group, channel within group, and depth d), and of a filter by
// (kh, kw, input channel within group, group, output channel within group,
// and depth d) from an offset. Views let one kernel run the gradients as
// convolutions over transposed, flipped operands without copying them. Depth
// comes last so that 2-D code can leave it out (a 2-D problem has depth 1).
struct TensorView {
  int64_t n, h, w, g, c, d = 0;
};
struct FilterView {
  int64_t offset, h, w, i, g, o, d = 0;
};

// Spatial axes, in the order of ConvGeometry's per-axis arrays (oneDNN's
// dims order): depth, height, width. The core is 3-D: a 2-D problem has a
// depth of 1 (and a 1-D one a height of 1 too).
constexpr int kSpatialAxes = 3;
enum SpatialAxis : int { kD = 0, kH = 1, kW = 2 };

struct ConvGeometry {
  int64_t batch = 0, in_c = 0;
  int64_t filter_in_c = 0, out_c = 0;  // (D)HWIO
  int64_t groups = 1;
  // Per spatial axis (kD, kH, kW); depth is 1, without padding, in 2-D.
  int64_t in[kSpatialAxes] = {1, 0, 0};
  int64_t filter[kSpatialAxes] = {1, 0, 0};
  int64_t out[kSpatialAxes] = {1, 0, 0};
  int64_t stride[kSpatialAxes] = {1, 1, 1};
  int64_t dilation[kSpatialAxes] = {1, 1, 1};
  // Zeros inserted between input samples (a transposed convolution's input):
  // the kernels see an input of (in - 1) * in_dilation + 1 samples.
  int64_t in_dilation[kSpatialAxes] = {1, 1, 1};
  int64_t pad_before[kSpatialAxes] = {0, 0, 0};  // negative: cropping
  int64_t pad_after[kSpatialAxes] = {0, 0, 0};
  DataFormat data_format = DataFormat::kNHWC;

  bool is_3d() const { return SpatialDims(data_format) == 3; }
  int64_t in_c_per_group() const { return filter_in_c; }
  int64_t out_c_per_group() const { return out_c / groups; }
  int64_t effective_filter(int a) const { return (filter[a] - 1) * dilation[a] + 1; }
  int64_t virtual_in(int a) const { return in[a] == 0 ? 0 : (in[a] - 1) * in_dilation[a] + 1; }
  int64_t in_pixels() const { return in[kD] * in[kH] * in[kW]; }
  int64_t out_pixels() const { return out[kD] * out[kH] * out[kW]; }
  int64_t filter_taps() const { return filter[kD] * filter[kH] * filter[kW]; }
  ImageStrides input_strides() const;
  ImageStrides output_strides() const;
  int64_t output_elements() const { return batch * out_pixels() * out_c; }
  // Every output is an empty sum (no input channel, no filter tap, or an
  // input without pixels, so that every window reads padding only): the
  // kernels write zeros, as tf.nn.conv2d does.
  bool empty_sums() const {
    bool empty = in_c_per_group() == 0;
    for (int a = 0; a < kSpatialAxes; ++a) empty |= filter[a] == 0 || in[a] == 0;
    return empty;
  }
  // No arithmetic to plan: an empty output, or zeros to write.
  bool no_work() const { return output_elements() == 0 || empty_sums(); }
  // Multiply-adds of the convolution (each is 2 FLOPs).
  int64_t macs() const {
    return batch * out_pixels() * out_c * filter_taps() * filter_in_c;
  }
  // Shape of the output tensor in data_format order.
  std::vector<int64_t> output_shape() const;
};

// The three passes of a convolution; each runs as a ConvProblem.
enum class Pass { kForward, kBackpropInput, kBackpropFilter };
const char* PassName(Pass p);

// A convolution as the kernels run it: geometry plus operand views, and the
// pass of the user's convolution it computes (the planners' cost models are
// per pass).
struct ConvProblem {
  Pass pass = Pass::kForward;
  ConvGeometry g;
  TensorView in, out;
  FilterView filter;
};

// The forward pass of a validated geometry on dense tensors (data_format,
// HWIO or DHWIO filter).
ConvProblem ForwardProblem(const ConvGeometry& g);
// dL/dinput as a convolution: input = dL/doutput upsampled by the strides
// (in_dilation), filter = the forward filter flipped with in and out channels
// swapped, output = dL/dinput. Tensors keep the forward layouts.
ConvProblem BackpropInputProblem(const ConvGeometry& g);
// dL/dfilter as a convolution: batch = input channels within a group,
// channels = the forward batch, input = the forward input, filter =
// dL/doutput (dilated by the forward strides, strided by the forward
// dilations), output = dL/dfilter (HWIO).
ConvProblem BackpropFilterProblem(const ConvGeometry& g);
// The problem that computes `pass` of the forward geometry g (one of the three above).
ConvProblem PassProblem(const ConvGeometry& g, Pass pass);

std::string ParsePadding(const std::string& s, Padding* out);
std::string ParseDataFormat(const std::string& s, DataFormat* out);

// Checks the attributes alone (lengths, signs, batch/depth entries).
std::string ValidateAttrs(const ConvAttrs& attrs);

// Output size of one spatial dimension. pad_before/pad_after are only read
// for EXPLICIT padding; the padding actually applied is returned through the
// out_pad_* pointers. `dim` names the dimension in error messages.
std::string ComputeOutputSize(int64_t in, int64_t filter, int64_t stride,
                              int64_t dilation, Padding padding,
                              int64_t pad_before, int64_t pad_after,
                              const char* dim, int64_t* out,
                              int64_t* out_pad_before, int64_t* out_pad_after);

// The full geometry. input_shape is in data_format order; filter_shape is
// HWIO (DHWIO for the 3-D formats). Validates everything, including ValidateAttrs.
std::string ComputeConvGeometry(const std::vector<int64_t>& input_shape,
                                const std::vector<int64_t>& filter_shape,
                                const ConvAttrs& attrs, ConvGeometry* g);

}  // namespace tfbigconv
