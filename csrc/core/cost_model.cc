#include "cost_model.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>

#include "fft_sizes.h"

namespace tfbigconv {
namespace {

std::mutex g_cost_model_mutex;
CostModel g_cost_model = [] {
  // Uncalibrated defaults (tfbigconv/cost_model.json replaces them at import).
  CostModel m;
  const double by_channels[kIm2colChannels] = {3e10, 1e11, 3e11, 3.5e11};
  for (auto& pass : m.im2col_flops_per_second)
    for (auto& side : pass)
      for (int c = 0; c < kIm2colChannels; ++c) side[c] = by_channels[c];
  for (auto& pass : m.tf_depthwise_flops_per_second)
    for (double& r : pass) r = 1e10;
  for (auto& pass : m.tf_depthwise_multiplier_flops_per_second)
    for (double& r : pass) r = 1e10;
  // GPU: work at a fixed rate per candidate (tf 50, direct 5, fft 1 TFLOP/s).
  const double log_rate[kGpuCandidates] = {std::log(5e13), std::log(5e12), std::log(1e12)};
  for (int c = 0; c < kGpuCandidates; ++c)
    for (auto& pass : m.gpu[c])
      for (auto& cls : pass) cls[0] = -log_rate[c];
  return m;
}();

const char* const kSlowdownDTypeNames[kSlowdownDTypes] = {"float16", "bfloat16", "float64"};
const char* const kGpuDTypeClassNames[kGpuDTypeClasses] = {"float32", "half"};
const char* const kGpuFeatureNames[kGpuFeatures] = {
    "intercept",  "log_side",         "log_channels",         "depthwise",
    "log_elements", "log_pixels", "log_side_squared", "log_side_x_log_pixels",
    "cudnn_depthwise_class"};

}  // namespace

std::string FormatBytes(int64_t b) {
  std::ostringstream os;
  os.precision(3);
  if (b >= (int64_t(1) << 30)) os << double(b) / double(int64_t(1) << 30) << " GiB";
  else if (b >= (1 << 20)) os << double(b) / double(1 << 20) << " MiB";
  else os << double(b) / 1024.0 << " KiB";
  return os.str();
}

std::string FormatSeconds(double s) {
  std::ostringstream os;
  os.precision(3);
  if (s >= 1) os << s << " s";
  else os << s * 1e3 << " ms";
  return os.str();
}

const char* AlgorithmName(Algorithm a) { return a == Algorithm::kFft ? "fft" : "direct"; }

namespace {
constexpr AlgorithmRequest kRequests[] = {AlgorithmRequest::kAuto, AlgorithmRequest::kTf,
                                          AlgorithmRequest::kDirect, AlgorithmRequest::kFft};
}  // namespace

const char* AlgorithmRequestName(AlgorithmRequest r) {
  static const char* const kNames[] = {"auto", "tf", "direct", "fft"};
  return kNames[int(r)];
}

std::string ParseAlgorithmRequest(const std::string& name, AlgorithmRequest* out) {
  for (AlgorithmRequest r : kRequests)
    if (name == AlgorithmRequestName(r)) {
      *out = r;
      return "";
    }
  // The alias is Python's (arguments.requested_algorithm), which passes "tf".
  return "algorithm must be 'auto', 'tf' (alias 'im2col'), 'direct' or 'fft', got '" + name + "'";
}

const char* DeviceName(Device d) { return d == Device::kCpu ? "CPU" : "GPU"; }

namespace {

// Every value of the model with its profile name, in the fixed order: the one
// place that order lives. `m` is a CostModel or a const one; f(name, value&).
template <class Model, class F>
void ForEachField(Model& m, F&& f) {
  f("direct_flops_per_second", m.direct_flops_per_second);
  f("direct_load_bound_flops_per_second", m.direct_load_bound_flops_per_second);
  f("direct_seconds_per_output", m.direct_seconds_per_output);
  f("direct_seconds_per_packed", m.direct_seconds_per_packed);
  f("direct_seconds_per_call", m.direct_seconds_per_call);
  f("fft_seconds_per_transform_flop", m.fft_seconds_per_transform_flop);
  f("fft_seconds_per_mix_flop", m.fft_seconds_per_mix_flop);
  f("fft_seconds_per_byte", m.fft_seconds_per_byte);
  f("fft_seconds_per_element", m.fft_seconds_per_element);
  f("fft_seconds_per_call", m.fft_seconds_per_call);
  const auto side = [](int s) { return ".side" + std::to_string(int(kIm2colSideAxis[s])); };
  for (int p = 0; p < kPasses; ++p)
    for (int s = 0; s < kIm2colSides; ++s)
      for (int c = 0; c < kIm2colChannels; ++c)
        f(std::string("im2col_flops_per_second.") + PassName(Pass(p)) + side(s) + ".channels" +
              std::to_string(int(kIm2colChannelAxis[c])),
          m.im2col_flops_per_second[p][s][c]);
  // Tables per pass and filter side (<prefix><pass>.side<S>), and per pass and
  // dtype (<prefix><pass>.<dtype>).
  const auto per_side = [&](const char* prefix, auto& table) {
    for (int p = 0; p < kPasses; ++p)
      for (int s = 0; s < kIm2colSides; ++s)
        f(std::string(prefix) + PassName(Pass(p)) + side(s), table[p][s]);
  };
  const auto per_dtype = [&](const char* prefix, auto& table) {
    for (int p = 0; p < kPasses; ++p)
      for (int t = 0; t < kSlowdownDTypes; ++t)
        f(std::string(prefix) + PassName(Pass(p)) + "." + kSlowdownDTypeNames[t], table[p][t]);
  };
  per_dtype("im2col_dtype_slowdown.", m.im2col_dtype_slowdown);
  per_side("im2col_channel_block.", m.im2col_channel_block);
  per_side("tf_depthwise_flops_per_second.", m.tf_depthwise_flops_per_second);
  per_side("tf_depthwise_multiplier_flops_per_second.", m.tf_depthwise_multiplier_flops_per_second);
  per_dtype("tf_depthwise_dtype_slowdown.", m.tf_depthwise_dtype_slowdown);
  for (int t = 0; t < kHalfDTypes; ++t)
    f(std::string("im2col_half_slow_path_side.") + kSlowdownDTypeNames[t],
      m.im2col_half_slow_path_side[t]);
  const auto gpu = [](int c, int p, int d) {
    return std::string("gpu.") + GpuCandidateName(GpuCandidate(c)) + "." + PassName(Pass(p)) +
           "." + kGpuDTypeClassNames[d] + ".";
  };
  for (int c = 0; c < kGpuCandidates; ++c)
    for (int p = 0; p < kPasses; ++p)
      for (int d = 0; d < kGpuDTypeClasses; ++d)
        for (int i = 0; i < kGpuFeatures; ++i)
          f(gpu(c, p, d) + kGpuFeatureNames[i], m.gpu[c][p][d][i]);
  for (int c = 0; c < kGpuCandidates; ++c)
    for (int p = 0; p < kPasses; ++p)
      for (int d = 0; d < kGpuDTypeClasses; ++d)
        f(gpu(c, p, d) + "floor_seconds", m.gpu_floor_seconds[c][p][d]);
}

}  // namespace

std::vector<std::string> CostModelFields() {
  std::vector<std::string> f;
  CostModel m;
  ForEachField(m, [&](const std::string& name, double&) { f.push_back(name); });
  return f;
}

std::vector<double> CostModelValues(const CostModel& m) {
  std::vector<double> v;
  ForEachField(m, [&](const std::string&, const double& x) { v.push_back(x); });
  return v;
}

std::string CostModelFromValues(const std::vector<double>& v, CostModel* out) {
  const std::vector<std::string> names = CostModelFields();
  if (v.size() != names.size())
    return "the cost model needs " + std::to_string(names.size()) + " values, got " +
           std::to_string(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    // Each algorithm's main term must be positive, so that estimates grow with the work.
    const bool main = names[i] == "direct_flops_per_second" ||
                      names[i] == "direct_load_bound_flops_per_second" ||
                      names[i] == "fft_seconds_per_transform_flop" ||
                      names[i].rfind("im2col", 0) == 0 || names[i].rfind("tf_depthwise", 0) == 0;
    const bool is_floor = names[i].size() > 14 &&
                          names[i].compare(names[i].size() - 14, 14, ".floor_seconds") == 0;
    const bool any_sign = names[i].rfind("gpu.", 0) == 0 && !is_floor;
    // Subnormal values are corrupt, not measured: 1/x overflows (an estimate of inf).
    const bool subnormal = std::fpclassify(v[i]) == FP_SUBNORMAL;
    if (!std::isfinite(v[i]) || subnormal || (!any_sign && (v[i] < 0 || (v[i] == 0 && main)))) {
      std::ostringstream os;
      os << "cost model value " << names[i] << " must be finite, positive and not subnormal, got "
         << v[i];
      return os.str();
    }
    if (names[i].rfind("im2col_channel_block.", 0) == 0 && !(v[i] >= 1 && v[i] <= 1024)) {
      std::ostringstream os;
      os << "cost model value " << names[i] << " must be a channel count from 1 to 1024, got "
         << v[i];
      return os.str();
    }
  }
  CostModel m;
  size_t i = 0;
  ForEachField(m, [&](const std::string&, double& x) { x = v[i++]; });
  *out = m;
  return "";
}

CostModel ActiveCostModel() {
  std::lock_guard<std::mutex> lock(g_cost_model_mutex);
  return g_cost_model;
}

void SetActiveCostModel(const CostModel& m) {
  std::lock_guard<std::mutex> lock(g_cost_model_mutex);
  g_cost_model = m;
}

std::string SetActiveCostModelValues(const std::vector<double>& values) {
  CostModel m;
  const std::string err = CostModelFromValues(values, &m);
  if (err.empty()) SetActiveCostModel(m);
  return err;
}

// ---- GPU model -------------------------------------------------------------

const char* GpuCandidateName(GpuCandidate c) {
  static const char* const kNames[] = {"tf", "direct", "fft"};
  return kNames[int(c)];
}

int GpuDTypeClass(DType dtype) {
  return dtype == DType::kHalf || dtype == DType::kBFloat16 ? 1 : 0;
}

// Depthwise, multiplier 1, a square filter of side 1, 3, 5 or 7, equal strides
// of 1 or 2, no dilation: where TF sends its float16 NHWC depthwise ops to
// cuDNN (ShouldCudnnGroupedConvolutionBeUsed; NCHW at any stride), cuDNN having
// dedicated NHWC kernels there. The data format is not asked: the grids are
// NHWC. On the H100 grids its half-precision filter gradient ran at 4.8-9.3
// TFLOP/s on the class's 7x7 layers, at 0.3-1.5 on depthwise layers outside it.
static bool CudnnDepthwiseClass(const ConvGeometry& g) {
  const int64_t k = g.filter[kH];
  return g.groups > 1 && g.in_c_per_group() == 1 && g.out_c_per_group() == 1 &&
         g.filter[kW] == k && (k == 1 || k == 3 || k == 5 || k == 7) &&
         g.stride[kH] == g.stride[kW] && g.stride[kH] <= 2 && g.dilation[kH] == 1 &&
         g.dilation[kW] == 1;
}

GpuModelTerms GpuTerms(const ConvGeometry& g, GpuCandidate c) {
  auto log1 = [](double x) { return std::log(std::max(x, 1.0)); };
  GpuModelTerms t;
  const double side = std::sqrt(double(g.filter[kH] * g.filter[kW]));
  const double cig = double(g.in_c_per_group()), cog = double(g.out_c_per_group());
  const double pixels = double(g.batch * g.out[kH] * g.out[kW]);
  const double elements =
      double(g.batch * g.in[kH] * g.in[kW] * g.in_c) + double(g.output_elements());
  if (c == GpuCandidate::kFft) {
    // Whole-image transforms: every input and output channel of every image
    // forward or back, the filter spectra once, and the per-bin channel mix.
    const int64_t fh = GoodFftSize((g.out[kH] - 1) * g.stride[kH] + g.effective_filter(kH));
    const int64_t fw = GoodFftSize((g.out[kW] - 1) * g.stride[kW] + g.effective_filter(kW));
    const double plane = double(fh * fw), logp = std::log2(std::max(plane, 2.0));
    const double transforms =
        double(g.batch) * double(g.in_c + g.out_c) + cig * double(g.out_c);
    t.work = transforms * plane * logp + 4.0 * double(g.batch) * double(g.out_c) * cig * plane;
  } else {
    t.work = 2.0 * double(g.macs());
  }
  t.work = std::max(t.work, 1.0);
  t.features[0] = 1;
  t.features[1] = log1(side);
  t.features[2] = log1(cig * cog);
  t.features[3] = g.groups > 1 && g.in_c_per_group() == 1 ? 1 : 0;
  t.features[4] = log1(elements);
  t.features[5] = log1(pixels);
  t.features[6] = t.features[1] * t.features[1];
  t.features[7] = t.features[1] * t.features[5];
  t.features[8] = CudnnDepthwiseClass(g) ? 1 : 0;
  return t;
}

double GpuSeconds(const CostModel& m, const ConvGeometry& g, Pass pass, DType dtype,
                  GpuCandidate c) {
  const GpuModelTerms t = GpuTerms(g, c);
  const double* k = m.gpu[int(c)][int(pass)][GpuDTypeClass(dtype)];
  double e = std::log(t.work);
  for (int i = 0; i < kGpuFeatures; ++i) e += k[i] * t.features[i];
  return std::max(std::exp(e), m.gpu_floor_seconds[int(c)][int(pass)][GpuDTypeClass(dtype)]);
}

std::string ChooseGpuKernel(const ConvProblem& problem, DType dtype, bool fft_possible,
                            double* direct_seconds, double* fft_seconds, Algorithm* choice) {
  const CostModel m = ActiveCostModel();
  *direct_seconds = GpuSeconds(m, problem.g, problem.pass, dtype, GpuCandidate::kDirect);
  *fft_seconds = GpuSeconds(m, problem.g, problem.pass, dtype, GpuCandidate::kFft);
  const bool fft = fft_possible && *fft_seconds < *direct_seconds;
  *choice = fft ? Algorithm::kFft : Algorithm::kDirect;
  std::ostringstream os;
  os << "estimated direct " << FormatSeconds(*direct_seconds) << ", fft ";
  if (fft_possible) os << FormatSeconds(*fft_seconds);
  else os << "not possible";
  return os.str();
}

}  // namespace tfbigconv
