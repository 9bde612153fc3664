#include "fft_plan.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <vector>

#include "checked_math.h"
#include "cost_model.h"
#include "fft_sizes.h"

namespace tfbigconv {
namespace {

// Choices that keep threads busy use these fixed counts, not the actual
// thread count, so that the plan (and so the arithmetic) does not depend on
// the number of threads unless the workspace limit binds.
constexpr int64_t kBusyBlock = 8;  // transforms per reduction block (all groups): a few per thread
constexpr int64_t kMinChunk = 8;   // items per chunk, or groups of items

// A plan may cost this much more than the cheapest if it needs less memory.
constexpr double kCostSlack = 1.10;

// Items per chunk beyond which a bigger chunk buys little (spectra of a chunk
// stay near the last-level cache) unless threads would idle.
constexpr int64_t kChunkTargetBytes = 16 << 20;

// 2-D channel planes staged together (FftPlan::stage_planes, at most
// kMaxStagePlanes2D: 8 float32 channels are 32 bytes of each pixel's cache
// line) stay within about 384 KiB, so that they and a spectrum fit in a
// core's L2.
constexpr int64_t kStageBytes = 384 << 10;
// 1-D blocks beyond kMaxStagePlanes3D planes stay within this many bytes of
// staged rows (a worker also holds a spectrum per plane): 64 planes of
// 32768 points take 8 MiB.
constexpr int64_t kStageBytes1D = 8 << 20;

// Lane groups a task stages (lane plans, and the fused backward): as many as
// fit kStageBytes1D, where a set of them reads whole cache lines of an NWC
// row, and few enough that each worker has a task (a group set of each of
// `items` items being a task).
int64_t LaneGroupsForTasks(int64_t lane_groups, int64_t items, int64_t group_bytes, int workers) {
  return std::max<int64_t>(
      1, std::min({kMaxLaneGroupsPerTask, kStageBytes1D / std::max<int64_t>(1, group_bytes),
                   CeilDiv(SatMul(lane_groups, items), std::max(workers, 1)), lane_groups}));
}

int64_t PreferredStagePlanes(const ConvGeometry& g, DType dtype, const FftPlan& p) {
  const int64_t plane = SatMul({p.fft_d, p.fft_h, p.fft_w, ComputeBytes(dtype)});
  // Lane plans count lanes, in groups of kFftLanes (LaneGroupsForTasks).
  if (LaneFftPlan(g, p))
    return kFftLanes * LaneGroupsForTasks(CeilDiv(g.groups, kFftLanes), p.items,
                                          SatMul(plane, kFftLanes), p.workers);
  // A block's filter planes (out_c * ci_block) are the most planes of any
  // phase (input planes: groups * ci_block; output planes: out_c).
  const int64_t most = g.out_c * p.ci_block;
  // Planes of height 1 (1-D problems) are transformed as the rows of one call,
  // which ducc0 vectorises across: at least a block of 16 whatever their size,
  // up to 64 within kStageBytes1D.
  if (p.fft_h == 1 && p.fft_d == 1) {
    const int64_t fit = std::max(kMaxStagePlanes3D, kStageBytes1D / std::max<int64_t>(1, plane));
    return std::max<int64_t>(1, std::min({kMaxStagePlanes1D, most, fit}));
  }
  // Volumes (3-D) never fit L2, one or many: a full block, so that the block's
  // channels share the tensor's cache lines where they are staged and written
  // back (one plane at a time read 4 bytes of every 64-byte line).
  if (p.fft_d > 1) return std::max<int64_t>(1, std::min(kMaxStagePlanes3D, most));
  return std::max<int64_t>(1, std::min({kMaxStagePlanes2D, most, kStageBytes / std::max<int64_t>(1, plane)}));
}

}  // namespace

void FillFftWorkspace(const ConvGeometry& g, DType dtype, FftPlan* p) {
  const int64_t real = ComputeBytes(dtype), cplx = 2 * real;
  p->tiles_d = CeilDiv(g.out[kD], p->tile_d);
  p->tiles_h = CeilDiv(g.out[kH], p->tile_h);
  p->tiles_w = CeilDiv(g.out[kW], p->tile_w);
  p->items = SatMul({g.batch, p->tiles_d, p->tiles_h, p->tiles_w});
  if (p->ci_block <= 0) p->ci_block = std::max<int64_t>(1, g.in_c_per_group());
  if (p->stage_planes <= 0) p->stage_planes = 1;
  p->fused_mix = g.in_c_per_group() <= kFusedMixMaxInChannels &&
                 p->ci_block >= g.in_c_per_group();
  // Saturating: a plan too large to allocate needs a workspace that fits no limit.
  const int64_t spectrum = SatMul({p->fft_d, p->fft_h, p->bins_w(), cplx});
  p->filter_spectra_bytes = SatMul({p->ci_block, g.out_c, spectrum});
  p->lanes = LaneFftPlan(g, *p);
  if (p->lanes) {  // no item spectra; buffers of kFftLanes rows (fft_plan.h)
    const int64_t group = SatMul({kFftLanes, p->fft_w, real});
    p->filter_spectra_bytes =
        g.in_c_per_group() == 1
            ? SatAdd(SatMul(CeilDiv(g.groups, kFftLanes), group), kLaneAlignBytes)
            : 0;
    p->item_spectra_bytes = 0;
    p->worker_bytes = SatAdd(SatMul(LaneWorkerBuffers(g, *p), group), kLaneAlignBytes);
    p->workspace_bytes =
        SatAdd(p->filter_spectra_bytes, SatMul(int64_t(p->workers), p->worker_bytes));
    return;
  }
  // Plane-local plans keep an item's spectra in the worker's (below).
  p->item_spectra_bytes =
      PlaneLocalFft(g, *p)
          ? 0
          : SatMul(SatAdd(SatMul(g.groups, p->ci_block), p->fused_mix ? 0 : g.out_c), spectrum);
  const bool one_row = p->fft_h == 1 && p->fft_d == 1;
  p->worker_bytes =
      SatAdd(SatMul({p->stage_planes, p->fft_d, p->fft_h, p->fft_w, real}),
             p->fused_mix ? SatMul(one_row ? p->stage_planes : 1, spectrum) : 0);
  p->workspace_bytes =
      SatAdd(SatAdd(p->filter_spectra_bytes, SatMul(p->chunk, p->item_spectra_bytes)),
             SatMul(int64_t(p->workers), p->worker_bytes));
}

std::string PlanLaneBackprop(const ConvGeometry& g, DType dtype, int64_t limit, int workers,
                             LaneBackpropPlan* out) {
  if (workers < 1) workers = 1;
  for (int a : {kD, kH})
    if (g.in[a] != 1 || g.filter[a] != 1 || g.out[a] != 1 || g.pad_before[a] != 0)
      return "not a 1-D convolution";
  if (g.in_c_per_group() != 1 || g.out_c_per_group() != 1)
    return "not depthwise with one output per channel";
  if (g.groups < kFftLanes) return "fewer channels than a group of lanes";
  if (g.no_work()) return "no arithmetic";
  FftPlan separate;
  if (!PlanFft(BackpropInputProblem(g).g, dtype, limit, workers, &separate).empty())
    return "dL/dinput has no FFT plan within the limit";
  if (separate.tiles_w != 1) return "dL/dinput's own plan tiles the row";
  LaneBackpropPlan p;
  p.workers = workers;
  p.fft_w = GoodFftSize(std::max(g.pad_before[kW] + g.in[kW],
                                 (g.out[kW] - 1) * g.stride[kW] + g.effective_filter(kW)));
  const int64_t group = SatMul({kFftLanes, p.fft_w, ComputeBytes(dtype)});
  const int64_t lane_groups = CeilDiv(g.groups, kFftLanes);
  // A task walks every image: one item's worth of tasks.
  for (int64_t per_task = LaneGroupsForTasks(lane_groups, 1, group, workers);; --per_task) {
    p.stage_planes = per_task * kFftLanes;
    p.worker_bytes = SatAdd(SatMul(4 * per_task + 2, group), kLaneAlignBytes);
    p.workspace_bytes = SatMul(int64_t(workers), p.worker_bytes);
    if (p.workspace_bytes <= limit) break;
    if (per_task == 1) return "its workspace exceeds the limit";
  }
  *out = p;
  return "";
}

std::string PlanFft(const ConvGeometry& g, DType dtype, int64_t limit, int workers,
                           FftPlan* out) {
  if (workers < 1) workers = 1;
  const int64_t eff_d = g.effective_filter(kD);
  const int64_t eff_h = g.effective_filter(kH);
  std::vector<TileCandidate> axes[kSpatialAxes];
  for (int a = 0; a < kSpatialAxes; ++a)
    axes[a] = TileCandidates(std::max<int64_t>(g.out[a], 1), g.stride[a], g.effective_filter(a),
                             g.pad_before[a], g.virtual_in(a));
  const std::vector<TileCandidate>& ds = axes[kD], &hs = axes[kH], &ws = axes[kW];
  bool found = false;
  FftPlan best;
  int64_t min_needed = std::numeric_limits<int64_t>::max();
  const double cig = double(g.in_c_per_group()), cin = double(g.in_c), cout = double(g.out_c);
  // Reduction blocks: all input channels of a group, else halves of them,
  // down to a few transforms per worker (over all groups) so that each
  // block's transforms keep every thread busy, and below that only when
  // nothing else fits.
  std::vector<int64_t> blocks;
  const int64_t cig_all = std::max<int64_t>(1, g.in_c_per_group());
  for (int64_t b = cig_all; ; b = (b + 1) / 2) {
    blocks.push_back(b);
    if (b == 1) break;
  }
  const int64_t busy = std::min<int64_t>(g.groups * cig_all, kBusyBlock);
  std::vector<FftPlan> fits;
  const CostModel m = ActiveCostModel();
  for (const TileCandidate& d : ds) {
    for (const TileCandidate& h : hs) {
      for (const TileCandidate& w : ws) {
        for (int64_t cib : blocks) {
          FftPlan p;
          p.tile_d = d.tile;
          p.fft_d = d.fft;
          p.tile_h = h.tile;
          p.fft_h = h.fft;
          p.tile_w = w.tile;
          p.fft_w = w.fft;
          p.workers = workers;
          p.ci_block = cib;
          p.chunk = 1;
          p.stage_planes = 1;
          FillFftWorkspace(g, dtype, &p);
          min_needed = std::min(min_needed, p.workspace_bytes);
          if (p.workspace_bytes > limit) continue;
          const int64_t per_item = std::max<int64_t>(1, p.item_spectra_bytes);  // 0: no channels
          const int64_t fit = 1 + (limit - p.workspace_bytes) / per_item;
          // Each group of an item is transformed and mixed on its own: many
          // groups keep the threads busy with fewer items.
          const int64_t target =
              std::max<int64_t>(CeilDiv(kMinChunk, g.groups), kChunkTargetBytes / per_item);
          p.chunk = std::max<int64_t>(1, std::min({p.items, fit, target}));
          FillFftWorkspace(g, dtype, &p);
          // Cost: transform and channel-mixing flops, and bytes moved through
          // memory, weighted by the calibrated model.
          // In 3-D: rows and columns per staged slice, then one depth transform
          // per (row, bin) of the volume (none in 2-D: fft_d = 1).
          const double bw = double(p.bins_w()), bins = double(p.bins());
          const double slab = double(p.fft_h) * bw * ComplexFftFlops(p.fft_d);
          const double in_slices = double(std::min(p.fft_d, (p.tile_d - 1) * g.stride[kD] + eff_d));
          const double in_rows = double(std::min(p.fft_h, (p.tile_h - 1) * g.stride[kH] + eff_h));
          const double fwd = cin * (in_slices * (in_rows * 0.5 * ComplexFftFlops(p.fft_w) +
                                                 bw * ComplexFftFlops(p.fft_h)) + slab);
          const double inv = cout * (slab + p.tile_d * (bw * ComplexFftFlops(p.fft_h) +
                                                        p.tile_h * 0.5 * ComplexFftFlops(p.fft_w)));
          const double mix = cig * cout * bins * 8.0;
          const double chunks = double(CeilDiv(p.items, p.chunk));
          // With several reduction blocks the filter spectra are redone per chunk.
          const double filt = cig * cout * (eff_d * (eff_h * 0.5 * ComplexFftFlops(p.fft_w) +
                                                     bw * ComplexFftFlops(p.fft_h)) + slab) *
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
  }
  // Blocks that leave threads idle only as a last resort.
  const bool any_busy = std::any_of(fits.begin(), fits.end(),
                                    [&](const FftPlan& p) { return g.groups * p.ci_block >= busy; });
  if (any_busy)
    fits.erase(std::remove_if(fits.begin(), fits.end(),
                              [&](const FftPlan& p) { return g.groups * p.ci_block < busy; }),
               fits.end());
  // The cheapest plan, or a plan within kCostSlack of it that needs less
  // memory: memory is what users run out of, a few percent of time is not.
  // The slack is measured from the cheapest plan, not from the last one
  // taken, so that it cannot compound.
  for (const FftPlan& p : fits)
    if (!found || p.cost < best.cost) {
      best = p;
      found = true;
    }
  const double cost_limit = best.cost * kCostSlack;
  for (const FftPlan& p : fits)
    if (p.cost <= cost_limit && p.workspace_bytes < best.workspace_bytes) best = p;
  if (!found) {
    std::ostringstream os;
    os << "the FFT algorithm needs a workspace of at least " << min_needed
       << " bytes for this convolution (one tile), but the limit is " << limit << " bytes";
    return os.str();
  }
  // Blocks of staged planes where they fit. They change no result, and the
  // tiling is chosen without them.
  FftPlan staged = best;
  staged.stage_planes = PreferredStagePlanes(g, dtype, best);
  FillFftWorkspace(g, dtype, &staged);
  *out = staged.workspace_bytes <= limit ? staged : best;
  return "";
}

}  // namespace tfbigconv
