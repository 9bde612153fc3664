#include "tf_estimate.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "checked_math.h"

namespace tfbigconv {
namespace {

// Piecewise-linear interpolation of log(table) over log(axis), clamped at the ends.
double LogInterp(const double* axis, int n, double x, int* i0, double* t) {
  x = std::min(std::max(x, axis[0]), axis[n - 1]);
  int i = 0;
  while (i + 2 < n && x > axis[i + 1]) ++i;
  *i0 = i;
  *t = (std::log(x) - std::log(axis[i])) / (std::log(axis[i + 1]) - std::log(axis[i]));
  return x;
}

double Im2colRate(const CostModel& m, Pass pass, double side, double channels) {
  int si, ci;
  double st, ct;
  LogInterp(kIm2colSideAxis, kIm2colSides, side, &si, &st);
  LogInterp(kIm2colChannelAxis, kIm2colChannels, channels, &ci, &ct);
  const auto& t = m.im2col_flops_per_second[int(pass)];
  auto l = [&](int s, int c) { return std::log(t[s][c]); };
  const double lo = l(si, ci) * (1 - ct) + l(si, ci + 1) * ct;
  const double hi = l(si + 1, ci) * (1 - ct) + l(si + 1, ci + 1) * ct;
  return std::exp(lo * (1 - st) + hi * st);
}

}  // namespace

const char* TfKernelName(TfKernel k) {
  switch (k) {
    case TfKernel::kConv2D: return "tf.Conv2D";
    case TfKernel::kDepthwiseConv2dNative: return "tf.DepthwiseConv2dNative";
    case TfKernel::kConv3D: return "tf.Conv3D";
    default: return "tf";
  }
}

namespace {

// A TF kernel's time in `dtype` over float32's, from its per-pass row of
// {float16, bfloat16, float64} slowdowns.
double DTypeSlowdown(const double (&slowdown)[kSlowdownDTypes], DType dtype) {
  if (dtype == DType::kHalf) return slowdown[0];
  if (dtype == DType::kBFloat16) return slowdown[1];
  if (dtype == DType::kDouble) return slowdown[2];
  return 1;
}

}  // namespace

int64_t TfColBufferImages(const ConvGeometry& ug, Pass pass, DType dtype, int workers) {
  if (pass == Pass::kForward || ug.batch <= 1) return 1;
  const int64_t item = DTypeBytes(dtype);
  const int64_t out_pixels = SatMul(ug.out[kH], ug.out[kW]);
  const int64_t patch = SatMul({ug.filter[kH], ug.filter[kW], ug.in_c_per_group()});
  const int64_t work_unit =
      SatAdd(SatAdd(SatMul(out_pixels, patch), SatMul(patch, ug.out_c)), SatMul(out_pixels, ug.out_c));
  if (work_unit <= 0) return 1;
  int64_t target;
  if (pass == Pass::kBackpropInput) {
    const int64_t threads = std::max(1, workers);
    if (work_unit / threads >= (int64_t(256) << 10) / item) return 1;
    target = (int64_t(30) << 20) / item;
  } else {
    target = (int64_t(32) << 20) / item;
  }
  return std::max<int64_t>(1, std::min(ug.batch, (target + work_unit - 1) / work_unit));
}

int64_t TfSpaceToBatchBytes(const ConvGeometry& ug, DType dtype) {
  if (ug.dilation[kH] == 1 && ug.dilation[kW] == 1) return 0;
  // The padded input, rounded up to whole blocks, and the undilated VALID
  // output over it: each pass holds one of each (its operands moved into the
  // batch, or one of them and its result before the move back).
  // The padding's twin: tfbigconv/kernels.py, _space_to_batch, which builds it
  // with tf.required_space_to_batch_paddings (base paddings: the convolution's
  // own, as this geometry holds them; the end padded up to whole blocks).
  const int64_t padded_h = SatAdd(SatAdd(ug.in[kH], ug.pad_before[kH]), ug.pad_after[kH]);
  const int64_t padded_w = SatAdd(SatAdd(ug.in[kW], ug.pad_before[kW]), ug.pad_after[kW]);
  const int64_t rows = CeilDiv(padded_h, ug.dilation[kH]);  // per phase
  const int64_t cols = CeilDiv(padded_w, ug.dilation[kW]);
  const int64_t phases = SatMul(ug.dilation[kH], ug.dilation[kW]);
  const int64_t out_rows = std::max<int64_t>(rows - ug.filter[kH] + 1, 0);
  const int64_t out_cols = std::max<int64_t>(cols - ug.filter[kW] + 1, 0);
  const int64_t in = SatMul({ug.batch, phases, rows, cols, ug.in_c});
  const int64_t out = SatMul({ug.batch, phases, out_rows, out_cols, ug.out_c});
  return SatMul(SatAdd(in, out), int64_t(DTypeBytes(dtype)));
}

Estimate TfEstimate(const ConvGeometry& ug, Pass pass, DType dtype, Device device,
                    const TfCandidate& tf, int64_t limit, int workers) {
  const TfKernel kernel = tf.kernel;
  const CostModel m = ActiveCostModel();
  Estimate e;
  e.available = kernel != TfKernel::kNone;
  // The side of a square filter with as many taps (3-D: all three axes).
  const double side = std::sqrt(double(ug.filter[kD] * ug.filter[kH] * ug.filter[kW]));
  if (ug.is_3d() && kernel != TfKernel::kConv3D) {  // Conv3D is TF's only 3-D candidate
    e.available = e.fits = false;
    e.peak_bytes = OperandBytes(ug, dtype);
    return e;
  }
  if (device == Device::kGpu) {
    const GpuModelTerms t = GpuTerms(ug, GpuCandidate::kTf);
    e.terms.assign(t.features, t.features + kGpuFeatures);
    e.terms.insert(e.terms.begin(), t.work);
    e.seconds = GpuSeconds(m, ug, pass, dtype, GpuCandidate::kTf);
    e.workspace_bytes = 0;
    e.note = "TensorFlow's GPU kernel (cuDNN); workspace not modelled";
  } else if (kernel == TfKernel::kDepthwiseConv2dNative) {
    int si;
    double st;
    LogInterp(kIm2colSideAxis, kIm2colSides, side, &si, &st);
    const double* r = ug.out_c_per_group() > 1
                          ? m.tf_depthwise_multiplier_flops_per_second[int(pass)]
                          : m.tf_depthwise_flops_per_second[int(pass)];
    const double rate = std::exp(std::log(r[si]) * (1 - st) + std::log(r[si + 1]) * st);
    e.terms = {2.0 * double(ug.macs()) *
                   DTypeSlowdown(m.tf_depthwise_dtype_slowdown[int(pass)], dtype),
               side, 1};
    e.seconds = e.terms[0] / rate;
    e.workspace_bytes = TfSpaceToBatchBytes(ug, dtype);
    e.note = e.workspace_bytes ? "SpaceToBatchND copies" : "no patch matrix";
  } else {
    // oneDNN vectorises a grouped forward pass across the groups, so it runs
    // like a dense one over all input channels (bench_dispatch: depthwise 15x15
    // at ~200 GFLOP/s, not the ~15 of a one-channel convolution).
    const int64_t in_c = pass == Pass::kForward ? ug.in_c : ug.in_c_per_group();
    const int64_t out_c = std::max<int64_t>(ug.out_c_per_group(), 1);
    double channels = double(in_c * out_c);
    double work = 2.0 * double(ug.macs());
    // A dense layer's written channels cost whole blocks (oneDNN's blocked
    // layouts: 1 to 16 take the same time on AVX-512), per side (its filter
    // gradient's slow path from side 15 runs pairs).
    // oneDNN's Conv3D runs every pass at about Conv2D's forward rate at as many taps
    // (benchmarks/check_conv3d_estimate.py), without the 2-D filter gradient's slow
    // path from side 15.
    const Pass rates = kernel == TfKernel::kConv3D ? Pass::kForward : pass;
    // oneDNN's float32 filter gradient leaves its fast path from side 15; the
    // half types run other code, at one rate across sides (Xeon with AMX,
    // sides 3-31: bfloat16 1.0-1.4 TFLOP/s, float16 0.7 GFLOP/s), so they
    // take float32's rates below that side times their slowdown, up to their
    // own slow path's side (im2col_half_slow_path_side), where they run float32's.
    const int half_index = dtype == DType::kHalf ? 0 : dtype == DType::kBFloat16 ? 1 : -1;
    const bool half_fast_path = half_index >= 0 && rates == Pass::kBackpropFilter &&
                                side < m.im2col_half_slow_path_side[half_index];
    const bool half_slow_path = half_index >= 0 && rates == Pass::kBackpropFilter &&
                                !half_fast_path;
    const double rate_side =
        half_fast_path ? std::min(side, kIm2colSideAxis[kIm2colSlowPathSide - 1]) : side;
    int block_side = 0;
    while (block_side + 1 < kIm2colSides && kIm2colSideAxis[block_side + 1] <= rate_side)
      ++block_side;
    const double block = std::round(m.im2col_channel_block[int(rates)][block_side]);
    const int64_t written = pass == Pass::kBackpropInput ? in_c : out_c;
    double padded = written;
    if (ug.groups == 1 && written > 0 && block > 1) {
      padded = std::ceil(double(written) / block) * block;
      channels *= padded / double(written);
      work *= padded / double(written);
    }
    const double slowdown =
        half_slow_path ? 1.0 : DTypeSlowdown(m.im2col_dtype_slowdown[int(rates)], dtype);
    e.terms = {work * slowdown, rate_side, channels};
    e.seconds = e.terms[0] / Im2colRate(m, rates, rate_side, channels);
    if (kernel == TfKernel::kConv3D) {
      // oneDNN's Conv3D (the one the rules trust) keeps no patch matrix we know the size of.
      e.workspace_bytes = 0;
      e.note = "Conv2D's forward rate at as many taps; workspace not modelled";
    } else if (tf.onednn || pass == Pass::kForward) {
      // Measured (RSS growth of one call, benchmarks/tf_workspace_rss.py): oneDNN's
      // three passes +0-3.7 MiB, Eigen's forward +0.4-7.4 MiB (its contraction
      // packs cache-sized blocks) on one 321x481 image by 135x135x1x3 and one
      // 128x128x64 by 3x3x64x64, where a patch matrix is 4.4 GiB and 36 MiB.
      e.workspace_bytes = 0;
      e.note = tf.onednn ? "oneDNN: no patch matrix (its scratch, a few MiB, not modelled)"
                         : "Eigen: no patch matrix (its packed blocks, a few MiB, not modelled)";
    } else {
      const int64_t images = TfColBufferImages(ug, pass, dtype, workers);
      e.workspace_bytes = SatMul({ug.out[kH], ug.out[kW], ug.filter[kH], ug.filter[kW], ug.in_c,
                                  int64_t(DTypeBytes(dtype)), images});
      if (ug.batch == 0) e.workspace_bytes = 0;
      e.note = images == 1 ? "col_buffer of one image"
                           : "col_buffer of " + std::to_string(images) + " images";
    }
    if (padded > double(written))
      e.note += std::string("; ") + (pass == Pass::kBackpropInput ? "input" : "output") +
                " channels run as " + std::to_string(int64_t(padded));
    if (half_slow_path)
      e.note += "; float32's slow path, as from side " +
                std::to_string(int64_t(std::ceil(m.im2col_half_slow_path_side[half_index])));
  }
  e.fits = e.workspace_bytes <= limit;
  e.peak_bytes = SatAdd(OperandBytes(ug, dtype), e.workspace_bytes);
  return e;
}

}  // namespace tfbigconv
