#include "plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <vector>

#include "direct_cpu.h"
#include "fft_backend_cpu.h"
#include "isa.h"

namespace tfbigconv {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Choices that keep threads busy use these fixed counts, not the actual
// thread count, so that the plan (and so the arithmetic) does not depend on
// the number of threads unless the workspace limit binds.
constexpr int64_t kBusyBlock = 8;  // reduction block: a few transforms per thread
constexpr int64_t kMinChunk = 8;   // items per chunk

// A plan may cost this much more than the cheapest if it needs less memory.
constexpr double kCostSlack = 1.10;

// Items per chunk beyond which a bigger chunk buys little (spectra of a chunk
// stay near the last-level cache) unless threads would idle.
constexpr int64_t kChunkTargetBytes = 16 << 20;

// Flops of a complex FFT of length n (the usual 5 n log2 n).
double FftFlops(int64_t n) { return n < 2 ? 0.0 : 5.0 * double(n) * std::log2(double(n)); }

// (tile, fft size) candidates along one dimension: every 7-smooth size from
// the smallest that holds the filter up to the one holding the whole output.
struct Dim {
  int64_t tile, fft;
};
std::vector<Dim> Candidates(int64_t out, int64_t stride, int64_t eff) {
  std::vector<Dim> c;
  const int64_t whole = fft::GoodSize((out - 1) * stride + eff);
  int64_t last_tile = 0;
  for (int64_t f = fft::GoodSize(eff); f <= whole; f = fft::GoodSize(f + 1)) {
    const int64_t tile = std::min(out, (f - eff) / stride + 1);
    if (tile > last_tile) c.push_back({tile, f});
    last_tile = tile;
    if (tile == out) break;
  }
  return c;
}

}  // namespace

void FillFftWorkspace(const ConvGeometry& g, DType dtype, FftPlan* p) {
  const int64_t real = ComputeBytes(dtype), cplx = 2 * real;
  p->tiles_h = CeilDiv(g.out_h, p->tile_h);
  p->tiles_w = CeilDiv(g.out_w, p->tile_w);
  p->items = g.batch * p->tiles_h * p->tiles_w;
  if (p->ci_block <= 0) p->ci_block = std::max<int64_t>(1, g.in_c_per_group());
  p->fused_mix = g.in_c_per_group() <= kFusedMixMaxInChannels &&
                 p->ci_block >= g.in_c_per_group();
  p->filter_spectra_bytes = p->ci_block * g.out_c * p->bins() * cplx;
  p->item_spectra_bytes =
      (g.groups * p->ci_block + (p->fused_mix ? 0 : g.out_c)) * p->bins() * cplx;
  p->worker_bytes = p->fft_h * p->fft_w * real + (p->fused_mix ? p->bins() * cplx : 0);
  p->workspace_bytes = p->filter_spectra_bytes + p->chunk * p->item_spectra_bytes +
                       int64_t(p->workers) * p->worker_bytes;
}

std::string PlanFft(const ConvGeometry& g, DType dtype, int64_t limit, int workers,
                           FftPlan* out) {
  if (workers < 1) workers = 1;
  const int64_t eff_h = g.effective_filter_h(), eff_w = g.effective_filter_w();
  const std::vector<Dim> hs = Candidates(std::max<int64_t>(g.out_h, 1), g.stride_h, eff_h);
  const std::vector<Dim> ws = Candidates(std::max<int64_t>(g.out_w, 1), g.stride_w, eff_w);
  bool found = false;
  FftPlan best;
  int64_t min_needed = std::numeric_limits<int64_t>::max();
  const double cig = double(g.in_c_per_group()), cin = double(g.in_c), cout = double(g.out_c);
  // Reduction blocks: all input channels of a group, else halves of them,
  // down to a few per worker so that each block's transforms keep every
  // thread busy, and below that only when nothing else fits.
  std::vector<int64_t> blocks;
  const int64_t cig_all = std::max<int64_t>(1, g.in_c_per_group());
  for (int64_t b = cig_all; ; b = (b + 1) / 2) {
    blocks.push_back(b);
    if (b == 1) break;
  }
  const int64_t busy = std::min<int64_t>(cig_all, kBusyBlock);
  std::vector<FftPlan> fits;
  const CostModel m = ActiveCostModel();
  for (const Dim& h : hs) {
    for (const Dim& w : ws) {
      for (int64_t cib : blocks) {
        FftPlan p;
        p.tile_h = h.tile;
        p.fft_h = h.fft;
        p.tile_w = w.tile;
        p.fft_w = w.fft;
        p.workers = workers;
        p.ci_block = cib;
        p.chunk = 1;
        FillFftWorkspace(g, dtype, &p);
        min_needed = std::min(min_needed, p.workspace_bytes);
        if (p.workspace_bytes > limit) continue;
        const int64_t per_item = std::max<int64_t>(1, p.item_spectra_bytes);  // 0: no channels
        const int64_t fit = 1 + (limit - p.workspace_bytes) / per_item;
        const int64_t target = std::max<int64_t>(kMinChunk, kChunkTargetBytes / per_item);
        p.chunk = std::max<int64_t>(1, std::min({p.items, fit, target}));
        FillFftWorkspace(g, dtype, &p);
        // Cost: transform and channel-mixing flops, and bytes moved through
        // memory, weighted by the calibrated model.
        const double bw = double(p.bins_w()), bins = double(p.bins());
        const double in_rows = double(std::min(p.fft_h, (p.tile_h - 1) * g.stride_h + eff_h));
        const double fwd = cin * (in_rows * 0.5 * FftFlops(p.fft_w) + bw * FftFlops(p.fft_h));
        const double inv = cout * (bw * FftFlops(p.fft_h) + p.tile_h * 0.5 * FftFlops(p.fft_w));
        const double mix = cig * cout * bins * 8.0;
        const double chunks = double(CeilDiv(p.items, p.chunk));
        // With several reduction blocks the filter spectra are redone per chunk.
        const double filt = cig * cout * (eff_h * 0.5 * FftFlops(p.fft_w) + bw * FftFlops(p.fft_h)) *
                            (p.ci_blocks(g) > 1 ? chunks : 1.0);
        // Fused mixing reads every filter spectrum once per item instead.
        const double filter_reads = p.fused_mix ? double(p.items) : chunks * p.ci_blocks(g);
        const double bytes = filter_reads * double(p.filter_spectra_bytes) +
                             3.0 * double(p.items) * double(p.item_spectra_bytes);
        p.transform_flops = double(p.items) * (fwd + inv) + filt;
        p.mix_flops = double(p.items) * mix;
        p.bytes = bytes;
        p.cost = m.fft_seconds_per_transform_flop * p.transform_flops +
                 m.fft_seconds_per_mix_flop * p.mix_flops + m.fft_seconds_per_byte * p.bytes;
        fits.push_back(p);
      }
    }
  }
  // Blocks that leave threads idle only as a last resort.
  const bool any_busy = std::any_of(fits.begin(), fits.end(),
                                    [&](const FftPlan& p) { return p.ci_block >= busy; });
  if (any_busy)
    fits.erase(std::remove_if(fits.begin(), fits.end(),
                              [&](const FftPlan& p) { return p.ci_block < busy; }),
               fits.end());
  // The cheapest plan, or a plan within kCostSlack of it that needs less
  // memory: memory is what users run out of, a few percent of time is not.
  for (const FftPlan& p : fits)
    if (!found || p.cost < best.cost) {
      best = p;
      found = true;
    }
  for (const FftPlan& p : fits)
    if (p.cost <= best.cost * kCostSlack && p.workspace_bytes < best.workspace_bytes) best = p;
  if (!found) {
    std::ostringstream os;
    os << "the FFT algorithm needs a workspace of at least " << min_needed
       << " bytes for this convolution (one tile), but the limit is " << limit << " bytes";
    return os.str();
  }
  *out = best;
  return "";
}

namespace {

std::mutex g_cost_model_mutex;
CostModel g_cost_model = [] {
  // Uncalibrated defaults (tfbigconv/cost_model.json replaces them at import).
  CostModel m;
  const double by_channels[kIm2colChannels] = {3e10, 1e11, 3e11, 3.5e11};
  for (auto& pass : m.im2col_flops_per_second)
    for (auto& side : pass)
      for (int c = 0; c < kIm2colChannels; ++c) side[c] = by_channels[c];
  return m;
}();

const char* const kPassNames[kPasses] = {"forward", "backprop_input", "backprop_filter"};
const char* const kSlowdownDTypes[3] = {"float16", "bfloat16", "float64"};

// The direct kernel with one or two output channels per column tile is
// load-bound (one vector load per one or two FMAs): measured 100 and ~200
// GFLOP/s against ~350. Lanes padding a row or the channels do no work, and
// double-precision vectors hold half the lanes.
double DirectEfficiency(const DirectBlocking& b, DType dtype) {
  double e = b.lane_utilization;
  if (!b.channel_vectors && b.channels_per_tile < 3) e *= b.channels_per_tile == 2 ? 0.6 : 0.3;
  return dtype == DType::kDouble ? e * 0.5 : e;
}

int64_t OperandBytes(const ConvGeometry& g, DType dtype) {
  const int64_t in = g.batch * g.in_h * g.in_w * g.in_c;
  const int64_t filter = g.filter_h * g.filter_w * g.filter_in_c * g.out_c;
  return (in + filter + g.output_elements()) * DTypeBytes(dtype);
}

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

std::string Bytes(int64_t b) {
  std::ostringstream os;
  os.precision(3);
  if (b >= (int64_t(1) << 30)) os << double(b) / double(int64_t(1) << 30) << " GiB";
  else if (b >= (1 << 20)) os << double(b) / double(1 << 20) << " MiB";
  else os << double(b) / 1024.0 << " KiB";
  return os.str();
}

std::string Seconds(double s) {
  std::ostringstream os;
  os.precision(3);
  if (s >= 1) os << s << " s";
  else os << s * 1e3 << " ms";
  return os.str();
}

}  // namespace

const char* PassName(Pass p) { return kPassNames[int(p)]; }

std::vector<std::string> CostModelFields() {
  std::vector<std::string> f = {"direct_flops_per_second", "direct_seconds_per_output",
                                "direct_seconds_per_packed", "direct_seconds_per_call",
                                "fft_seconds_per_transform_flop", "fft_seconds_per_mix_flop",
                                "fft_seconds_per_byte",      "fft_seconds_per_element",
                                "fft_seconds_per_call"};
  for (int p = 0; p < kPasses; ++p)
    for (int s = 0; s < kIm2colSides; ++s)
      for (int c = 0; c < kIm2colChannels; ++c)
        f.push_back(std::string("im2col_flops_per_second.") + kPassNames[p] + ".side" +
                    std::to_string(int(kIm2colSideAxis[s])) + ".channels" +
                    std::to_string(int(kIm2colChannelAxis[c])));
  for (const char* t : kSlowdownDTypes) f.push_back(std::string("im2col_dtype_slowdown.") + t);
  return f;
}

std::vector<double> CostModelValues(const CostModel& m) {
  std::vector<double> v = {m.direct_flops_per_second, m.direct_seconds_per_output,
                           m.direct_seconds_per_packed, m.direct_seconds_per_call,
                           m.fft_seconds_per_transform_flop, m.fft_seconds_per_mix_flop,
                           m.fft_seconds_per_byte,      m.fft_seconds_per_element,
                           m.fft_seconds_per_call};
  for (const auto& pass : m.im2col_flops_per_second)
    for (const auto& side : pass)
      for (double r : side) v.push_back(r);
  for (double x : m.im2col_dtype_slowdown) v.push_back(x);
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
                      names[i] == "fft_seconds_per_transform_flop" ||
                      names[i].rfind("im2col", 0) == 0;
    if (!std::isfinite(v[i]) || v[i] < 0 || (v[i] == 0 && main))
      return "cost model value " + names[i] + " must be finite and positive, got " +
             std::to_string(v[i]);
  }
  CostModel m;
  size_t i = 0;
  m.direct_flops_per_second = v[i++];
  m.direct_seconds_per_output = v[i++];
  m.direct_seconds_per_packed = v[i++];
  m.direct_seconds_per_call = v[i++];
  m.fft_seconds_per_transform_flop = v[i++];
  m.fft_seconds_per_mix_flop = v[i++];
  m.fft_seconds_per_byte = v[i++];
  m.fft_seconds_per_element = v[i++];
  m.fft_seconds_per_call = v[i++];
  for (auto& pass : m.im2col_flops_per_second)
    for (auto& side : pass)
      for (double& r : side) r = v[i++];
  for (double& x : m.im2col_dtype_slowdown) x = v[i++];
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

std::string ChooseAlgorithm(const ConvGeometry& g, DType dtype, const std::string& requested,
                            int64_t limit, int workers, AlgorithmChoice* c) {
  if (requested != "auto" && requested != "direct" && requested != "fft")
    return "algorithm must be 'auto', 'direct' or 'fft', got '" + requested + "'";
  const CostModel m = ActiveCostModel();
  *c = AlgorithmChoice();
  const int64_t operands = OperandBytes(g, dtype);
  Estimate& d = c->direct;
  d.available = true;
  const DirectBlocking blocking = DirectConvBlocking(g, dtype, ActiveIsa());
  d.workspace_bytes = blocking.scratch_bytes_per_worker * std::max(workers, 1);
  d.fits = d.workspace_bytes <= limit;
  d.terms = {2.0 * double(g.macs()) / DirectEfficiency(blocking, dtype),
             double(g.output_elements()), double(blocking.packed_elements), 1};
  d.seconds = d.terms[0] / m.direct_flops_per_second + m.direct_seconds_per_output * d.terms[1] +
              m.direct_seconds_per_packed * d.terms[2] + m.direct_seconds_per_call;
  d.peak_bytes = operands + d.workspace_bytes;
  d.note = "scratch per thread";
  Estimate& f = c->fft;
  // A requested direct pass (the kernels' hot path) needs no FFT plan.
  const std::string fft_err = requested == "direct" ? "not planned: direct requested"
                                                    : PlanFft(g, dtype, limit, workers, &c->fft_plan);
  f.available = f.fits = fft_err.empty();
  if (f.fits) {
    const double elements = double(g.batch * g.in_h * g.in_w * g.in_c + g.output_elements());
    const FftPlan& fp = c->fft_plan;
    f.terms = {fp.transform_flops, fp.mix_flops, fp.bytes, elements, 1};
    f.seconds = fp.cost + m.fft_seconds_per_element * elements + m.fft_seconds_per_call;
    f.workspace_bytes = fp.workspace_bytes;
    f.peak_bytes = operands + f.workspace_bytes;
    std::ostringstream os;
    os << "tile " << fp.tile_h << "x" << fp.tile_w << " (FFT " << fp.fft_h << "x" << fp.fft_w
       << "), chunk " << fp.chunk << " of " << fp.items << " items";
    f.note = os.str();
  } else {
    f.note = fft_err;
  }
  if (requested == "fft") {
    if (!f.fits) return fft_err;
    c->algorithm = Algorithm::kFft;
    c->reason = "fft requested";
  } else if (requested == "direct") {
    if (!d.fits)
      return "the direct algorithm needs " + std::to_string(d.workspace_bytes) +
             " bytes of scratch, but the limit is " + std::to_string(limit) + " bytes";
    c->reason = "direct requested";
  } else if (!d.fits && !f.fits) {
    return "no algorithm fits the workspace limit of " + std::to_string(limit) +
           " bytes: direct needs " + std::to_string(d.workspace_bytes) + " bytes; " + fft_err;
  } else {
    const bool fft = f.fits && (!d.fits || f.seconds < d.seconds);
    c->algorithm = fft ? Algorithm::kFft : Algorithm::kDirect;
    c->reason = std::string("auto: ") + (fft ? "fft" : "direct") + " is the fastest that fits";
  }
  return "";
}

Estimate Im2colEstimate(const ConvGeometry& ug, Pass pass, DType dtype, int64_t limit) {
  const CostModel m = ActiveCostModel();
  Estimate e;
  e.available = true;
  const double side = std::sqrt(double(ug.filter_h * ug.filter_w));
  // oneDNN vectorises a grouped forward pass across the groups, so it runs
  // like a dense one over all input channels (bench_dispatch: depthwise 15x15
  // at ~200 GFLOP/s, not the ~15 of a one-channel convolution).
  const int64_t in_c = pass == Pass::kForward ? ug.in_c : ug.in_c_per_group();
  const double channels = double(in_c * std::max<int64_t>(ug.out_c_per_group(), 1));
  double slowdown = 1;
  if (dtype == DType::kHalf) slowdown = m.im2col_dtype_slowdown[0];
  if (dtype == DType::kBFloat16) slowdown = m.im2col_dtype_slowdown[1];
  if (dtype == DType::kDouble) slowdown = m.im2col_dtype_slowdown[2];
  e.terms = {2.0 * double(ug.macs()) * slowdown, side, channels};
  e.seconds = e.terms[0] / Im2colRate(m, pass, side, channels);
  e.workspace_bytes = ug.out_h * ug.out_w * ug.filter_h * ug.filter_w * ug.in_c * DTypeBytes(dtype);
  if (ug.batch == 0) e.workspace_bytes = 0;
  e.fits = e.workspace_bytes <= limit;
  e.peak_bytes = OperandBytes(ug, dtype) + e.workspace_bytes;
  e.note = pass == Pass::kForward ? "patch matrix of one image (upper bound)"
                                  : "col_buffer of one image";
  return e;
}

std::string PlanPass(const ConvGeometry& ug, Pass pass, DType dtype, const std::string& requested,
                     int64_t limit, int workers, bool im2col_available, PassPlan* out) {
  if (requested != "auto" && requested != "im2col" && requested != "direct" && requested != "fft")
    return "algorithm must be 'auto', 'im2col', 'direct' or 'fft', got '" + requested + "'";
  PassPlan p;
  p.pass = pass;
  const ConvGeometry g = pass == Pass::kForward          ? ForwardProblem(ug).g
                         : pass == Pass::kBackpropInput ? BackpropInputProblem(ug).g
                                                        : BackpropFilterProblem(ug).g;
  AlgorithmChoice c;
  const std::string ours = requested == "im2col" ? "auto" : requested;
  const std::string err = ChooseAlgorithm(g, dtype, ours, limit, workers, &c);
  p.direct = c.direct;
  p.fft = c.fft;
  p.fft_plan = c.fft_plan;
  p.im2col = Im2colEstimate(ug, pass, dtype, limit);
  if (!im2col_available) {
    p.im2col.available = false;
    p.im2col.note = "not supported by TensorFlow for this case";
  }
  const Estimate& i = p.im2col;
  if (requested == "im2col") {
    if (!i.available) return "algorithm 'im2col' is not available: " + i.note;
    p.chosen = "im2col";
    p.reason = "im2col requested";
  } else if (!err.empty()) {
    if (requested != "auto" || !(i.available && i.fits)) return err;
    p.chosen = "im2col";
    p.reason = "auto: im2col, the only algorithm that fits";
  } else {
    p.chosen = c.algorithm == Algorithm::kFft ? "fft" : "direct";
    const Estimate& ours_e = c.algorithm == Algorithm::kFft ? p.fft : p.direct;
    if (requested == "auto" && i.available && i.fits && i.seconds < ours_e.seconds) p.chosen = "im2col";
    p.reason = requested == "auto" ? "auto: " + p.chosen + " is the fastest that fits" : c.reason;
  }
  if (requested == "auto") {
    // Name the runners-up and why the others were out.
    std::ostringstream os;
    os << p.reason << " (est. ";
    bool first = true;
    for (const auto& [name, e] : {std::pair<std::string, const Estimate*>{"im2col", &p.im2col},
                                  {"direct", &p.direct}, {"fft", &p.fft}}) {
      os << (first ? "" : ", ") << name << " ";
      first = false;
      if (!e->available && name == "im2col") os << "unavailable";
      else if (!e->fits) os << "needs " << Bytes(e->workspace_bytes) << " > limit " << Bytes(limit);
      else os << Seconds(e->seconds);
    }
    os << ")";
    p.reason = os.str();
  }
  *out = p;
  return "";
}

}  // namespace tfbigconv

