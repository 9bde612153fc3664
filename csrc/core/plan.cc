#include "plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "checked_math.h"
#include "direct_cpu.h"
#include "fft_gpu_layout.h"
#include "fft_sizes.h"
#include "isa.h"

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
  p->tiles_d = CeilDiv(g.out_d, p->tile_d);
  p->tiles_h = CeilDiv(g.out_h, p->tile_h);
  p->tiles_w = CeilDiv(g.out_w, p->tile_w);
  p->items = SatMul({g.batch, p->tiles_d, p->tiles_h, p->tiles_w});
  if (p->ci_block <= 0) p->ci_block = std::max<int64_t>(1, g.in_c_per_group());
  if (p->stage_planes <= 0) p->stage_planes = 1;
  p->fused_mix = g.in_c_per_group() <= kFusedMixMaxInChannels &&
                 p->ci_block >= g.in_c_per_group();
  // Saturating: a plan too large to allocate needs a workspace that fits no limit.
  const int64_t spectrum = SatMul({p->fft_d, p->fft_h, p->bins_w(), cplx});
  p->filter_spectra_bytes = SatMul({p->ci_block, g.out_c, spectrum});
  p->lanes = LaneFftPlan(g, *p);
  if (p->lanes) {  // no item spectra; buffers of kFftLanes rows (plan.h)
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
  if (g.in_d != 1 || g.filter_d != 1 || g.out_d != 1 || g.pad_front != 0 || g.in_h != 1 ||
      g.filter_h != 1 || g.out_h != 1 || g.pad_top != 0)
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
  p.fft_w = GoodFftSize(std::max(g.pad_left + g.in_w,
                                 (g.out_w - 1) * g.stride_w + g.effective_filter_w()));
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
  const int64_t eff_d = g.effective_filter_d();
  const int64_t eff_h = g.effective_filter_h(), eff_w = g.effective_filter_w();
  const std::vector<TileCandidate> ds = TileCandidates(std::max<int64_t>(g.out_d, 1), g.stride_d,
                                                       eff_d, g.pad_front, g.virtual_in_d());
  const std::vector<TileCandidate> hs = TileCandidates(std::max<int64_t>(g.out_h, 1), g.stride_h,
                                                       eff_h, g.pad_top, g.virtual_in_h());
  const std::vector<TileCandidate> ws = TileCandidates(std::max<int64_t>(g.out_w, 1), g.stride_w,
                                                       eff_w, g.pad_left, g.virtual_in_w());
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
          const double in_slices = double(std::min(p.fft_d, (p.tile_d - 1) * g.stride_d + eff_d));
          const double in_rows = double(std::min(p.fft_h, (p.tile_h - 1) * g.stride_h + eff_h));
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

namespace {

// The direct kernel's work in its two rate classes, {compute-bound flops,
// load-bound flops} (cost_model.h). A column tile of one or two output
// channels is load-bound (one vector load per one or two FMAs): its flops are
// counted per channel at the load-bound rate. Lanes padding a row or the
// channels do no work, double-precision vectors hold half the lanes, and the
// ParallelFor's static split leaves workers idle in the last wave of tasks
// (a filter gradient with one task runs on one thread).
std::pair<double, double> DirectFlops(const DirectBlocking& b, const ConvGeometry& g, DType dtype,
                                      int workers) {
  const int64_t w = std::max(workers, 1);
  const int64_t tasks = std::max<int64_t>(b.tasks, 1);
  const double waves = double(CeilDiv(tasks, w) * w) / double(tasks);
  double flops = 2.0 * double(g.macs()) * waves / b.lane_utilization;
  if (dtype == DType::kDouble) flops *= 2;
  // The groups kernel loads a panel vector and a filter vector per FMA (no
  // reuse across channels), so it runs at the load-bound rate; the column
  // kernel with C channels reuses each panel load C times.
  if (b.group_vectors) return {0, flops};
  const bool load_bound = !b.channel_vectors && b.channels_per_tile < 3;
  if (load_bound) return {0, flops / std::max(b.channels_per_tile, 1)};
  return {flops, 0};
}

int64_t OperandBytes(const ConvGeometry& g, DType dtype) {
  // Each tensor's bytes fit (ComputeConvGeometry checks); their sum may not.
  const int64_t in = g.batch * g.in_d * g.in_h * g.in_w * g.in_c;
  const int64_t filter = g.filter_d * g.filter_h * g.filter_w * g.filter_in_c * g.out_c;
  return SatAdd(SatAdd(in * DTypeBytes(dtype), filter * DTypeBytes(dtype)),
                g.output_elements() * DTypeBytes(dtype));
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

}  // namespace

Status ChooseAlgorithm(const ConvGeometry& g, DType dtype, const std::string& requested,
                       int64_t limit, int workers, AlgorithmChoice* c) {
  if (requested != "auto" && requested != "direct" && requested != "fft")
    return Status::InvalidArgument("algorithm must be 'auto', 'direct' or 'fft', got '" +
                                   requested + "'");
  const CostModel m = ActiveCostModel();
  *c = AlgorithmChoice();
  const int64_t operands = OperandBytes(g, dtype);
  if (g.no_work()) {
    // An empty output, or zeros to write (DirectConv and FftConv do that
    // before any blocking or plan): either algorithm runs without workspace.
    for (Estimate* e : {&c->direct, &c->fft}) {
      e->available = e->fits = true;
      e->peak_bytes = operands;
      e->note = "nothing to compute: empty tensors";
    }
    c->direct.terms = {0, 0, double(g.output_elements()), 0, 1};
    c->direct.seconds = m.direct_seconds_per_output * double(g.output_elements()) +
                        m.direct_seconds_per_call;
    c->fft.terms = {0, 0, 0, double(g.output_elements()), 1};
    c->fft.seconds = m.fft_seconds_per_element * double(g.output_elements()) +
                     m.fft_seconds_per_call;
    c->algorithm = requested == "fft" ? Algorithm::kFft : Algorithm::kDirect;
    c->reason = requested == "auto" ? "auto: direct, nothing to compute" : requested + " requested";
    return Status::Ok();
  }
  Estimate& d = c->direct;
  d.available = true;
  const DirectBlocking blocking = DirectConvBlocking(g, dtype, ActiveIsa(), workers);
  d.workspace_bytes = SatMul(blocking.scratch_bytes_per_worker, std::max(workers, 1));
  d.fits = d.workspace_bytes <= limit;
  const auto [compute_flops, load_bound_flops] = DirectFlops(blocking, g, dtype, workers);
  d.terms = {compute_flops, load_bound_flops, double(g.output_elements()),
             double(blocking.packed_elements), 1};
  d.seconds = d.terms[0] / m.direct_flops_per_second +
              d.terms[1] / m.direct_load_bound_flops_per_second +
              m.direct_seconds_per_output * d.terms[2] + m.direct_seconds_per_packed * d.terms[3] +
              m.direct_seconds_per_call;
  d.peak_bytes = SatAdd(operands, d.workspace_bytes);
  d.note = "scratch per thread";
  Estimate& f = c->fft;
  // A requested direct pass (the kernels' hot path) needs no FFT plan.
  const std::string fft_err = requested == "direct" ? "not planned: direct requested"
                                                    : PlanFft(g, dtype, limit, workers, &c->fft_plan);
  f.available = f.fits = fft_err.empty();
  if (f.fits) {
    const double elements =
        double(g.batch * g.in_d * g.in_h * g.in_w * g.in_c + g.output_elements());
    const FftPlan& fp = c->fft_plan;
    f.terms = {fp.transform_flops, fp.mix_flops, fp.bytes, elements, 1};
    f.seconds = fp.cost + m.fft_seconds_per_element * elements + m.fft_seconds_per_call;
    f.workspace_bytes = fp.workspace_bytes;
    f.peak_bytes = SatAdd(operands, f.workspace_bytes);
    std::ostringstream os;
    os << "tile ";
    if (g.is_3d()) os << fp.tile_d << "x";
    os << fp.tile_h << "x" << fp.tile_w << " (FFT ";
    if (g.is_3d()) os << fp.fft_d << "x";
    os << fp.fft_h << "x" << fp.fft_w
       << "), chunk " << fp.chunk << " of " << fp.items << " items";
    f.note = os.str();
  } else {
    f.note = fft_err;
  }
  if (requested == "fft") {
    if (!f.fits) return Status::ResourceExhausted(fft_err);
    c->algorithm = Algorithm::kFft;
    c->reason = "fft requested";
  } else if (requested == "direct") {
    if (!d.fits)
      return Status::ResourceExhausted("the direct algorithm needs " +
                                       std::to_string(d.workspace_bytes) +
                                       " bytes of scratch, but the limit is " +
                                       std::to_string(limit) + " bytes");
    c->reason = "direct requested";
  } else if (!d.fits && !f.fits) {
    return Status::ResourceExhausted("no algorithm fits the workspace limit of " +
                                     std::to_string(limit) + " bytes: direct needs " +
                                     std::to_string(d.workspace_bytes) + " bytes; " + fft_err);
  } else {
    const bool fft = f.fits && (!d.fits || f.seconds < d.seconds);
    c->algorithm = fft ? Algorithm::kFft : Algorithm::kDirect;
    c->reason = std::string("auto: ") + AlgorithmName(c->algorithm) + " is the fastest that fits";
  }
  return Status::Ok();
}

// ---- the planner of one pass ----------------------------------------------

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
  const int64_t out_pixels = SatMul(ug.out_h, ug.out_w);
  const int64_t patch = SatMul({ug.filter_h, ug.filter_w, ug.in_c_per_group()});
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
  if (ug.dilation_h == 1 && ug.dilation_w == 1) return 0;
  // The padded input, rounded up to whole blocks, and the undilated VALID
  // output over it: each pass holds one of each (its operands moved into the
  // batch, or one of them and its result before the move back).
  // The padding's twin: tfbigconv/kernels.py, _space_to_batch, which builds it
  // with tf.required_space_to_batch_paddings (base paddings: the convolution's
  // own, as this geometry holds them; the end padded up to whole blocks).
  const int64_t padded_h = SatAdd(SatAdd(ug.in_h, ug.pad_top), ug.pad_bottom);
  const int64_t padded_w = SatAdd(SatAdd(ug.in_w, ug.pad_left), ug.pad_right);
  const int64_t rows = CeilDiv(padded_h, ug.dilation_h);  // per phase
  const int64_t cols = CeilDiv(padded_w, ug.dilation_w);
  const int64_t phases = SatMul(ug.dilation_h, ug.dilation_w);
  const int64_t out_rows = std::max<int64_t>(rows - ug.filter_h + 1, 0);
  const int64_t out_cols = std::max<int64_t>(cols - ug.filter_w + 1, 0);
  const int64_t in = SatMul({ug.batch, phases, rows, cols, ug.in_c});
  const int64_t out = SatMul({ug.batch, phases, out_rows, out_cols, ug.out_c});
  return SatMul(SatAdd(in, out), int64_t(DTypeBytes(dtype)));
}

Estimate TfEstimate(const ConvGeometry& ug, Pass pass, DType dtype, Device device,
                    TfKernel kernel, int64_t limit, int workers) {
  const CostModel m = ActiveCostModel();
  Estimate e;
  e.available = kernel != TfKernel::kNone;
  // The side of a square filter with as many taps (3-D: all three axes).
  const double side = std::sqrt(double(ug.filter_d * ug.filter_h * ug.filter_w));
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
    // take float32's rates below that side times their slowdown.
    const bool half = dtype == DType::kHalf || dtype == DType::kBFloat16;
    const double rate_side = half && rates == Pass::kBackpropFilter
                                 ? std::min(side, kIm2colSideAxis[kIm2colSlowPathSide - 1])
                                 : side;
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
    e.terms = {work * DTypeSlowdown(m.im2col_dtype_slowdown[int(rates)], dtype), rate_side,
               channels};
    e.seconds = e.terms[0] / Im2colRate(m, rates, rate_side, channels);
    if (kernel == TfKernel::kConv3D) {
      // oneDNN's Conv3D (the one the rules trust) keeps no patch matrix we know the size of.
      e.workspace_bytes = 0;
      e.note = "Conv2D's forward rate at as many taps; workspace not modelled";
    } else {
      const int64_t images = TfColBufferImages(ug, pass, dtype, workers);
      e.workspace_bytes = SatMul({ug.out_h, ug.out_w, ug.filter_h, ug.filter_w, ug.in_c,
                                  int64_t(DTypeBytes(dtype)), images});
      if (ug.batch == 0) e.workspace_bytes = 0;
      e.note = pass == Pass::kForward ? "patch matrix of one image (upper bound)"
               : images == 1          ? "col_buffer of one image"
                                      : "col_buffer of " + std::to_string(images) + " images";
    }
    if (padded > double(written))
      e.note += std::string("; ") + (pass == Pass::kBackpropInput ? "input" : "output") +
                " channels run as " + std::to_string(int64_t(padded));
  }
  e.fits = e.workspace_bytes <= limit;
  e.peak_bytes = SatAdd(OperandBytes(ug, dtype), e.workspace_bytes);
  return e;
}

namespace {

// Our two kernels on the GPU for one pass: the run-time chooser's estimates
// and its choice (ChooseGpuKernel, as cuda/plan_gpu.cc makes it).
Algorithm PlanGpuOurs(const ConvProblem& problem, DType dtype, const ConvGeometry& ug,
                      int64_t limit, PassPlan* p) {
  const int64_t operands = OperandBytes(ug, dtype);
  const int64_t fft_min = FftGpuMinWorkspaceBytes(problem.g, dtype);
  double ds, fs;
  Algorithm choice;
  ChooseGpuKernel(problem, dtype, fft_min <= limit, &ds, &fs, &choice);
  auto fill = [&](Estimate* e, GpuCandidate c, double seconds, int64_t ws, const char* note) {
    const GpuModelTerms t = GpuTerms(problem.g, c);
    e->available = true;
    e->seconds = seconds;
    e->workspace_bytes = ws;
    e->fits = ws <= limit;
    e->peak_bytes = SatAdd(operands, ws);
    e->note = note;
    e->terms.assign(t.features, t.features + kGpuFeatures);
    e->terms.insert(e->terms.begin(), t.work);
  };
  fill(&p->direct, GpuCandidate::kDirect, ds, 0, "partial sums only within the budget");
  fill(&p->fft, GpuCandidate::kFft, fs, fft_min,
       "smallest plan; the kernel tiles and chunks within the budget at run time");
  return choice;
}

}  // namespace

Status PlanPass(const ConvGeometry& ug, Pass pass, DType dtype, Device device,
                const std::string& requested, int64_t limit, int workers, const TfCandidate& tf,
                PassPlan* out) {
  if (requested != "auto" && requested != "tf" && requested != "direct" && requested != "fft")
    return Status::InvalidArgument("algorithm must be 'auto', 'tf' (alias 'im2col'), 'direct' or "
                                   "'fft', got '" + requested + "'");
  PassPlan p;
  p.pass = pass;
  p.device = device;
  const ConvProblem problem = PassProblem(ug, pass);
  Status err;
  Algorithm ours = Algorithm::kDirect;
  if (device == Device::kCpu) {
    AlgorithmChoice c;
    err = ChooseAlgorithm(problem.g, dtype, requested == "tf" ? "auto" : requested, limit,
                          workers, &c);
    p.direct = c.direct;
    p.fft = c.fft;
    p.fft_plan = c.fft_plan;
    ours = c.algorithm;
  } else {
    ours = PlanGpuOurs(problem, dtype, ug, limit, &p);
    if (requested == "fft" && !p.fft.fits)
      err = Status::ResourceExhausted("the GPU fft needs a workspace of at least " +
                                      FormatBytes(p.fft.workspace_bytes) + ", but the limit is " +
                                      FormatBytes(limit));
    if (requested == "fft") ours = Algorithm::kFft;
    if (requested == "direct") ours = Algorithm::kDirect;
  }
  p.tf = TfEstimate(ug, pass, dtype, device, tf.kernel, limit, workers);
  if (!tf.note.empty()) p.tf.note = tf.note;
  const Estimate& t = p.tf;
  // auto may pick TF's kernel where it runs, fits, and its estimate is trusted.
  const bool tf_eligible = t.available && t.fits && tf.estimate_trusted;
  if (requested == "tf") {
    if (!t.available) return Status::Unavailable("algorithm 'tf' is not available: " + t.note);
    p.chosen = "tf";
    p.reason = "tf requested";
  } else if (!err.ok()) {
    if (requested != "auto" || !tf_eligible) return err;
    p.chosen = "tf";
    p.reason = "auto: tf, the only algorithm that fits";
  } else {
    p.chosen = AlgorithmName(ours);
    const Estimate& ours_e = ours == Algorithm::kFft ? p.fft : p.direct;
    // A tie goes to TF's kernel (on the GPU, small problems all estimate at
    // their launch floors, and cuDNN is then the safer pick).
    if (requested == "auto" && tf_eligible && t.seconds <= ours_e.seconds) p.chosen = "tf";
    p.reason = requested == "auto" ? "auto: " + p.chosen + " is the fastest that fits"
                                   : p.chosen + " requested";
  }
  if (requested == "auto") {
    // Name the runners-up and why the others were out.
    std::ostringstream os;
    os << p.reason << " (est. ";
    bool first = true;
    for (const auto& [name, e] :
         {std::pair<std::string, const Estimate*>{TfKernelName(tf.kernel), &p.tf},
          {"direct", &p.direct}, {"fft", &p.fft}}) {
      os << (first ? "" : ", ") << name << " ";
      first = false;
      if (!e->available && e == &p.tf) os << "unavailable";
      else if (!e->fits) os << "needs " << FormatBytes(e->workspace_bytes) << " > limit " << FormatBytes(limit);
      else if (e == &p.tf && !tf.estimate_trusted) os << FormatSeconds(e->seconds) << " untrusted";
      else os << FormatSeconds(e->seconds);
    }
    os << ")";
    p.reason = os.str();
  }
  *out = p;
  return Status::Ok();
}

}  // namespace tfbigconv
