// The planner's cost model: its constants (CostModel, as named numbers for
// JSON profiles), the process-wide active model, and the GPU model that both
// the trace-time planner (gpu_estimate.cc) and the GPU kernels' run-time choice
// (cuda/plan_gpu.cc) evaluate. Needs nothing but geometry.cc, so the TF-free
// CUDA harness links it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {

// Our two kernels, on either device: the CPU planner's and the GPU planner's
// choice (plan.h, cuda/plan_gpu.h).
enum class Algorithm { kDirect, kFft };
const char* AlgorithmName(Algorithm a);  // "direct" or "fft"

// What a caller asks the planners for: their choice (auto), TensorFlow's own
// kernel (tf), or one of ours; and what PlanPass chose (never kAuto).
enum class AlgorithmRequest { kAuto, kTf, kDirect, kFft };
const char* AlgorithmRequestName(AlgorithmRequest r);  // "auto", "tf", "direct", "fft"
inline AlgorithmRequest RequestOf(Algorithm a) {
  return a == Algorithm::kFft ? AlgorithmRequest::kFft : AlgorithmRequest::kDirect;
}
// The one parser of algorithm names, called only where a name enters C++:
// the op kernels' attributes (csrc/tf/attrs.h), _core's and the CUDA
// harness's arguments. Returns "" or why the name is not one of the four.
std::string ParseAlgorithmRequest(const std::string& name, AlgorithmRequest* out);

// Where a pass runs; each device has its own candidates and cost model.
enum class Device { kCpu, kGpu };
const char* DeviceName(Device d);

// The cost model's constants. Defaults are this file's; Python replaces them
// at import with the shipped calibration (tfbigconv/cost_model.json) or the
// user's own (`python -m tfbigconv calibrate`), in both compiled modules.
// CPU:
//   direct  seconds = compute-bound flops / direct_flops_per_second
//                     + load-bound flops / direct_load_bound_flops_per_second
//                     (flops over the lanes used and the last wave of tasks,
//                     per channel where load-bound: plan.cc, DirectFlops)
//                     + direct_seconds_per_output * output elements
//                     + direct_seconds_per_packed * elements packed
//                     + direct_seconds_per_call
//   fft     seconds = fft_seconds_per_transform_flop * FftPlan::transform_flops
//                     + fft_seconds_per_mix_flop * FftPlan::mix_flops
//                     + fft_seconds_per_byte * FftPlan::bytes
//                     + fft_seconds_per_element * (input + output elements)
//                     + fft_seconds_per_call
//   tf.Conv2D (im2col)  seconds = 2 macs / rate, rate interpolated (log-log)
//                     in a table over filter side and channel product, per pass;
//                     for a dense layer, macs and product with the channels the
//                     pass writes rounded up to im2col_channel_block (per pass
//                     and side).
//   tf.DepthwiseConv2dNative  seconds = 2 macs / rate, rate interpolated
//                     (log-log) over filter side, per pass and for a channel
//                     multiplier of 1 or over 1.
//   Both TF kernels' rates are float32's; other dtypes take the kernel's
//   slowdown for the pass (im2col_ / tf_depthwise_dtype_slowdown).
// GPU (fitted to measured kernel times, see GpuModelTerms):
//   log(seconds) = log(work) + sum_i gpu[candidate][pass][dtype class][i] * feature_i
constexpr int kIm2colSides = 5;     // filter sides (sqrt of taps): 3, 7, 14, 15, 31
constexpr int kIm2colChannels = 4;  // channels in x out per group: 1, 16, 256, 2048
constexpr int kPasses = 3;
constexpr int kSlowdownDTypes = 3;  // float16, bfloat16, float64 (over float32)
constexpr int kHalfDTypes = 2;      // float16, bfloat16 (the first two of those)
constexpr double kNoSlowPathSide = 1e6;  // a side no filter reaches
constexpr int kGpuCandidates = 3;   // GpuCandidate
constexpr int kGpuDTypeClasses = 2; // float32 and float64; float16 and bfloat16
constexpr int kGpuFeatures = 9;     // GpuModelTerms::features
struct CostModel {
  double direct_flops_per_second = 3.5e11;
  // A column tile of one output channel; C channels run at C times this.
  double direct_load_bound_flops_per_second = 1.05e11;
  double direct_seconds_per_output = 1e-9;
  double direct_seconds_per_packed = 0;
  double direct_seconds_per_call = 0;
  double fft_seconds_per_transform_flop = 1.0 / 3.9e10;
  double fft_seconds_per_mix_flop = 1.0 / 3.9e10;
  double fft_seconds_per_byte = 1.0 / 3.9e10;
  double fft_seconds_per_element = 0;
  double fft_seconds_per_call = 0;
  // FLOP/s of tf.nn.conv2d (float32) per pass, filter side and channel product.
  double im2col_flops_per_second[kPasses][kIm2colSides][kIm2colChannels] = {};
  // TF's Conv2D time in float16, bfloat16, float64 over float32's, per pass
  // (Eigen's half-type gradients ran 5-30x float32's, its forward 1-3x).
  double im2col_dtype_slowdown[kPasses][kSlowdownDTypes] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  // Per pass and filter side (the block of the largest axis side not above
  // the layer's): TF's Conv2D runs the channels its pass writes (forward and
  // filter gradient: out; input gradient: in) in blocks of this many, so a
  // narrower layer costs a whole block. oneDNN with AVX-512: 16, but 2 in the
  // filter gradient's slow path from side 15 (it runs pairs); 1 = no
  // blocking, the model before this existed. Dense layers only.
  double im2col_channel_block[kPasses][kIm2colSides] = {{1, 1, 1, 1, 1}, {1, 1, 1, 1, 1},
                                                         {1, 1, 1, 1, 1}};
  // FLOP/s of TF's DepthwiseConv2dNative ops (float32) per pass and filter side.
  double tf_depthwise_flops_per_second[kPasses][kIm2colSides] = {};
  // The same with a channel multiplier over 1 (measured at 2): other code in
  // oneDNN builds, which run multiplier 1 only (3-17x slower per FLOP at 2).
  double tf_depthwise_multiplier_flops_per_second[kPasses][kIm2colSides] = {};
  // DepthwiseConv2dNative's time in float16, bfloat16, float64 over float32's,
  // per pass (oneDNN's bfloat16 depthwise: 0.8-1.1x float32's at side 7, 0.5-1.4x
  // across layers; its Conv2D 0.5x).
  double tf_depthwise_dtype_slowdown[kPasses][kSlowdownDTypes] = {{1, 1, 1}, {1, 1, 1},
                                                                  {1, 1, 1}};
  // The filter side from which TF's Conv2D filter gradient in float16 and
  // bfloat16 runs float32's slow path (float32's rates, no slowdown); below it
  // they run at the rate of the side before kIm2colSlowPathSide times their
  // slowdown. oneDNN with AVX512_BF16 and no AMX (Zen 4), bfloat16: 16->16
  // channels on a 40x40 image 4.3-7.2 s at sides 15-19 (float32's slow path);
  // 3->8 on 96x96 2.6-8 ms up to side 24, then 4.7-12 s: 15, the slow path of
  // the common case. With AMX (Xeon) none up to 31. kNoSlowPathSide: none.
  double im2col_half_slow_path_side[kHalfDTypes] = {kNoSlowPathSide, kNoSlowPathSide};
  // The GPU model's coefficients (any sign).
  double gpu[kGpuCandidates][kPasses][kGpuDTypeClasses][kGpuFeatures] = {};
  // The shortest call measured per candidate, pass and dtype class: no GPU
  // estimate goes below it (launch latency; the log-linear terms would
  // extrapolate tiny problems to microseconds no kernel reaches).
  double gpu_floor_seconds[kGpuCandidates][kPasses][kGpuDTypeClasses] = {};
};
// The table's axes. 14 and 15 both: oneDNN's Conv2D filter gradient runs at
// 30-100 GFLOP/s up to K = 14 and at 0.3-0.6 from K = 15 (RESULTS.md), a step
// that interpolating from 7 to 15 spread over sides 8-14.
constexpr double kIm2colSideAxis[kIm2colSides] = {3, 7, 14, 15, 31};
// oneDNN's float32 filter gradient leaves its fast path from this side
// (kIm2colSideAxis[3] = 15): the half types' rates stop below it (tf_estimate.cc).
constexpr int kIm2colSlowPathSide = 3;
constexpr double kIm2colChannelAxis[kIm2colChannels] = {1, 16, 256, 2048};

// The model as named numbers, in a fixed order (for Python and JSON).
std::vector<std::string> CostModelFields();
std::vector<double> CostModelValues(const CostModel& m);
// Errors: wrong count, or a CPU value that is not finite and positive (zero
// is allowed for the secondary terms: per output, packed, mix flop, byte,
// element and call); GPU coefficients need only be finite, GPU floors must be
// finite and not negative.
std::string CostModelFromValues(const std::vector<double>& values, CostModel* m);
// The process-wide model (thread-safe).
CostModel ActiveCostModel();
void SetActiveCostModel(const CostModel& m);
// CostModelFromValues, then SetActiveCostModel: "" or why the values were
// rejected (the active model is then unchanged). Used by every module that
// receives a profile: _core, the op library, the CUDA harness.
std::string SetActiveCostModelValues(const std::vector<double>& values);

// ---- GPU model -------------------------------------------------------------

enum class GpuCandidate { kTf, kDirect, kFft };
const char* GpuCandidateName(GpuCandidate c);

// The GPU model's inputs for one candidate: `work` (2 macs for tf and direct;
// transform and mixing work for fft) and features {1, log filter side,
// log(in x out channels per group), depthwise, log(input + output elements),
// log(batch x output pixels), log side squared, log side x log pixels}. The
// last two let the rate bend with the filter side (cuDNN changes algorithm
// with it); on the H100 grids they halve the cases where a pick is over 1.1x
// cuDNN, leaving each geometry out (benchmarks/RESULTS.md). Last, 1 for the
// depthwise layers cuDNN has dedicated half-precision kernels for
// (CudnnDepthwiseClass), else 0: a geometry class, for every candidate (for
// ours on the pass's problem), fitted in the half class only (gpu_fit.py).
// `g` is the user's geometry for tf (cuDNN sees the convolution as the user
// wrote it) and the pass's ConvProblem geometry for direct and fft (what our
// kernels run), so the GPU kernels' run-time choice needs nothing but its
// ConvProblem.
struct GpuModelTerms {
  double work = 0;
  double features[kGpuFeatures] = {};
};
GpuModelTerms GpuTerms(const ConvGeometry& g, GpuCandidate c);
int GpuDTypeClass(DType dtype);
double GpuSeconds(const CostModel& m, const ConvGeometry& g, Pass pass, DType dtype,
                  GpuCandidate c);

// The choice between our two GPU kernels for one ConvProblem, shared by the
// trace-time planner and the GPU kernels' run-time "auto" (cuda/plan_gpu.cc):
// the faster estimate, fft only if it is possible. Returns the reason.
std::string ChooseGpuKernel(const ConvProblem& problem, DType dtype, bool fft_possible,
                            double* direct_seconds, double* fft_seconds, Algorithm* choice);

// Human-readable sizes and times for reasons and notes ("1.5 MiB", "3.2 ms").
std::string FormatBytes(int64_t bytes);
std::string FormatSeconds(double seconds);

}  // namespace tfbigconv
