#include "plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
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
  const int64_t real = FftRealBytes(dtype), cplx = 2 * real;
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
        // Cost: transform and channel-mixing flops, plus bytes moved through
        // memory, each weighted 1 (calibration comes with the dispatcher).
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
        p.cost = double(p.items) * (fwd + inv + mix) + filt + bytes;
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
// Throughputs of the two algorithms on the 2-core development machine (see
// benchmarks/RESULTS.md): the direct kernel's FLOP/s, and FFT cost-model
// units per second. Rough; the dispatcher issue calibrates them per machine.
constexpr double kDirectFlopsPerSecond = 3.5e11;
constexpr double kFftUnitsPerSecond = 3.9e10;

// The column kernel with one or two output channels per tile is load-bound
// (one vector load per one or two FMAs): measured 100 and ~200 GFLOP/s.
double DirectEfficiency(const ConvGeometry& g, DType dtype) {
  const DirectBlocking b = DirectConvBlocking(g, dtype, ActiveIsa());
  if (b.channel_vectors || b.channels_per_tile >= 3) return 1.0;
  return b.channels_per_tile == 2 ? 0.6 : 0.3;
}
}  // namespace

std::string ChooseAlgorithm(const ConvGeometry& g, DType dtype, const std::string& requested,
                            int64_t limit, int workers, AlgorithmChoice* c) {
  if (requested != "auto" && requested != "direct" && requested != "fft")
    return "algorithm must be 'auto', 'direct' or 'fft', got '" + requested + "'";
  *c = AlgorithmChoice();
  c->direct_seconds =
      2.0 * double(g.macs()) / (kDirectFlopsPerSecond * DirectEfficiency(g, dtype));
  std::string fft_err;
  if (requested != "direct") {
    fft_err = PlanFft(g, dtype, limit, workers, &c->fft);
    if (fft_err.empty()) c->fft_seconds = c->fft.cost / kFftUnitsPerSecond;
  }
  if (requested == "fft") {
    if (!fft_err.empty()) return fft_err;
    c->algorithm = Algorithm::kFft;
    c->reason = "fft requested";
  } else if (requested == "direct") {
    c->reason = "direct requested";
  } else if (!fft_err.empty()) {
    c->reason = "auto: direct, no FFT plan fits the workspace limit";
  } else {
    c->algorithm = c->fft_seconds < c->direct_seconds ? Algorithm::kFft : Algorithm::kDirect;
    std::ostringstream os;
    os << "auto: estimated direct " << c->direct_seconds << " s, fft " << c->fft_seconds << " s";
    c->reason = os.str();
  }
  return "";
}

}  // namespace tfbigconv
