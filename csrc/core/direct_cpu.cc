#include "direct_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "checked_math.h"
#include "direct_cpu_microkernels.h"

namespace tfbigconv {
namespace {

using direct::ChansTile;
using direct::ColsTile;
using direct::KernelTable;

template <typename T>
const KernelTable<T>& Table(Isa isa);
template <>
const KernelTable<float>& Table<float>(Isa isa) {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  if (isa == Isa::kAvx512) return direct::avx512::kFloat;
  if (isa == Isa::kAvx2) return direct::avx2::kFloat;
#endif
  (void)isa;
  return direct::baseline::kFloat;
}
template <>
const KernelTable<double>& Table<double>(Isa isa) {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  if (isa == Isa::kAvx512) return direct::avx512::kDouble;
  if (isa == Isa::kAvx2) return direct::avx2::kDouble;
#endif
  (void)isa;
  return direct::baseline::kDouble;
}

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Scratch targets: the panel and the filter block should sit in L2 together.
constexpr int64_t kPanelBytes = 512 << 10;
constexpr int64_t kFilterBytes = 256 << 10;
// The accumulator tile is touched once per kernel call, so it may be large.
constexpr int64_t kAccBytes = 1 << 20;
// Output rows per task are cut to make at least this many tasks (image
// blocks follow the ParallelFor's workers instead, see MakeLayout).
constexpr int64_t kMinTasks = 16;
// Output pixels per task: each packed filter element then serves this many
// multiply-adds, so packing costs a few percent at most.
constexpr int64_t kTaskPixels = 4096;
// The panels of a task's images together (each image has its own).
constexpr int64_t kImagePanelsBytes = 4 << 20;

// Everything derived from the geometry that the task loop needs.
struct Layout {
  DirectBlocking b;
  int64_t lanes = 0;
  int64_t unit = 0;      // columns per vector (cols) or pixels per group (chans)
  int64_t wo_pad = 0;    // output columns rounded up to `unit`
  int64_t co_pad = 0;    // chans: out channels per group rounded up to CV*lanes
  int64_t qlen = 0;      // panel entries per phase row
  int64_t group_tasks = 0;  // tasks per image along groups (a block of groups each)
  int64_t row_blocks = 0;
  int64_t panel_rows_max = 0;
  int64_t panel_elems = 0, filter_elems = 0, acc_elems = 0;

  int64_t PanelRows(int64_t nkh, const ConvGeometry& g) const {
    return SatAdd(SatMul(b.task_rows - 1, g.stride[kH]), (nkh - 1) * g.dilation[kH] + 1);
  }
};

// Depth (3-D problems): each (image, output depth) pair is an "image" of the
// task decomposition, one per task, and the filter's depth taps are an outer
// reduction loop, each packing its input plane's panels.
bool HasDepth(const ConvGeometry& g) {
  return g.in[kD] != 1 || g.filter[kD] != 1 || g.out[kD] != 1;
}
ConvGeometry DepthAsImages(const ConvGeometry& g) {
  ConvGeometry r = g;
  r.batch = SatMul(g.batch, g.out[kD]);
  return r;
}

template <typename T>
Layout MakeLayout(const ConvGeometry& g3, const KernelTable<T>& kt, int workers) {
  const ConvGeometry g = DepthAsImages(g3);
  Layout l;
  const int64_t L = kt.lanes, cog = g.out_c_per_group(), cig = g.in_c_per_group();
  l.lanes = L;
  // One output channel per group, channels last, and a vector's worth of
  // groups (depthwise filters in NHWC or NDHWC, in all three passes): vectors run
  // along the groups, whose channels sit side by side. The other kernels
  // pack one group at a time, a value per cache line there, and ran a 3x3
  // depthwise forward at a fifth of their model's rate.
  l.b.group_vectors = cog == 1 && g.groups >= L && ChannelsLast(g.data_format);
  // Two channel vectors per tile keep loads under FMAs; below that the
  // column kernel (C=4: 6 loads per 24 FMAs) does better than one vector,
  // except on outputs at most half a vector wide (filter gradients of small
  // filters), where its column vectors would hold mostly padding.
  const int64_t ow = std::max<int64_t>(g.out[kW], 1);
  l.b.channel_vectors = !l.b.group_vectors && (cog >= 2 * L || (cog >= L && 2 * ow <= L));
  // Narrow pixel groups where the wide ones would compute far more padded
  // pixels (a 3x3 filter gradient's 3-pixel rows filled 3 of 12). Per lane,
  // the narrow kernels ran at about 0.7 (chans) and 0.5 (groups: a load per
  // FMA) of the wide ones' speed, so they need at least 1.5x and 2x less work.
  const int64_t narrow_work = RoundUp(ow, kt.chans_pixels[1]);
  const int64_t wide_work = RoundUp(ow, kt.chans_pixels[0]);
  l.b.narrow_pixels = l.b.group_vectors     ? narrow_work * 2 <= wide_work
                      : l.b.channel_vectors ? narrow_work * 3 <= wide_work * 2
                                            : false;
  int64_t row_bytes, row_multiple;
  if (l.b.group_vectors) {
    // Blocks of two group vectors; a task whose block holds at most `lanes`
    // groups (the last one) runs one vector.
    l.b.channels_per_tile = g.groups >= 2 * L ? 2 : 1;
    l.b.group_block = l.b.channels_per_tile * L;
    l.unit = kt.chans_pixels[l.b.narrow_pixels];
    l.co_pad = 1;
    l.wo_pad = RoundUp(ow, l.unit);
    row_bytes = SatMul({l.wo_pad, l.b.group_block, int64_t(sizeof(T))});
    row_multiple = 1;
  } else if (l.b.channel_vectors) {
    // Tiles of two channel vectors, and one of a single vector for a tail
    // of at most `lanes` channels (both kernels use the same pixel groups).
    l.b.channels_per_tile = 2;
    l.unit = kt.chans_pixels[l.b.narrow_pixels];
    l.co_pad = RoundUp(cog, L);
    l.wo_pad = RoundUp(ow, l.unit);
    row_bytes = SatMul({l.wo_pad, l.co_pad, int64_t(sizeof(T))});
    row_multiple = 1;
  } else {
    l.b.channels_per_tile = int(std::min<int64_t>(cog, 4));
    l.unit = L;
    l.co_pad = cog;
    l.wo_pad = RoundUp(ow, L);
    // No output channels: no work (the kernel returns early), but a sane layout.
    row_bytes = SatMul({std::max<int64_t>(cog, 1), l.wo_pad, int64_t(sizeof(T))});
    row_multiple = direct::kTaskRows;  // every micro-kernel row count divides it
  }
  // Enough pixels per task to amortise packing the filter block, within the
  // accumulator budget and short of starving the threads.
  l.group_tasks = CeilDiv(g.groups, l.b.group_block);
  const int64_t images = std::max<int64_t>(1, g.batch * l.group_tasks);
  l.qlen = l.wo_pad + (g.filter[kW] - 1) * g.dilation[kW] / g.stride[kW];
  int64_t rows = std::min({CeilDiv(kTaskPixels, l.wo_pad), kAccBytes / row_bytes,
                           CeilDiv(g.out[kH] * images, kMinTasks)});
  if (l.b.group_vectors) {
    // A group block's panel rows are wide (a vector or two per column), so
    // fit the task's rows to the panel budget with the whole filter height
    // (else each filter-row block packs the rows again: 7 times for a 7x7
    // stride-2 forward)...
    const int64_t eff_kh = g.effective_filter(kH);
    const int64_t panel_rows =
        kPanelBytes / std::max<int64_t>(1, SatMul({g.stride[kW], l.qlen, l.b.group_block,
                                                   int64_t(sizeof(T))}));
    if (panel_rows >= eff_kh) rows = std::min(rows, (panel_rows - eff_kh) / g.stride[kH] + 1);
    // ...but not below the filter's height in output rows, where panels of
    // neighbouring tasks would overlap more than they hold (a filter
    // gradient, whose "filter" is the whole image, packed it once per row).
    rows = std::max(rows, std::min(CeilDiv(eff_kh, g.stride[kH]), kAccBytes / row_bytes));
  }
  rows = std::min(std::max<int64_t>(rows, 1), std::max<int64_t>(g.out[kH], 1));
  l.b.task_rows = RoundUp(rows, row_multiple);
  l.acc_elems = SatMul(l.b.task_rows, row_bytes / int64_t(sizeof(T)));
  // Shrink the (in-channel, filter-row) block until the panel and the filter
  // block of one channel tile (what a micro-kernel streams) fit.
  const int64_t tile_c = l.b.group_vectors     ? l.b.group_block
                         : l.b.channel_vectors ? std::min(l.co_pad, 2 * L)
                                               : std::min<int64_t>(cog, 4);
  // Values per panel entry and input channel: a block of groups (groups
  // kernel), else one (the chans kernel's entries hold ci_block channels).
  const int64_t entry = l.b.group_block;
  int64_t cib = cig, khb = g.filter[kH];
  for (;;) {
    const int64_t panel =
        SatMul({cib, l.PanelRows(khb, g), g.stride[kW], l.qlen, entry, int64_t(sizeof(T))});
    const int64_t filt = SatMul({cib, khb, g.filter[kW], tile_c, int64_t(sizeof(T))});
    if (panel <= kPanelBytes && filt <= kFilterBytes) break;
    if (khb >= cib && khb > 1) khb = CeilDiv(khb, 2);
    else if (cib > 1) cib = CeilDiv(cib, 2);
    else break;
  }
  l.b.ci_block = cib;
  l.b.kh_block = khb;
  l.panel_rows_max = l.PanelRows(khb, g);
  l.panel_elems = SatMul({cib, l.panel_rows_max, g.stride[kW], l.qlen, entry});
  l.filter_elems = SatMul({cib, khb, g.filter[kW], tile_c});
  l.row_blocks = CeilDiv(g.out[kH], l.b.task_rows);
  // What a task packs: its group's whole filter, and each image's panels
  // (per depth tap in 3-D).
  const int64_t filter_per_task =
      SatMul({g.filter[kD], g.filter[kH], g.filter[kW], cig, l.co_pad, entry});
  const int64_t panels_per_image = SatMul({g.filter[kD], CeilDiv(g.filter[kH], khb), cig,
                                           l.panel_rows_max, g.stride[kW], l.qlen, entry});
  // Images per task. Where the output rows are few (a filter gradient's
  // output is the filter), each packed filter element serves few
  // multiply-adds: 9 in a 3x3 filter gradient, which spent most of its time
  // packing. The images of a task then share each packed filter block, up to
  // as many panels as the filter holds (past that, packing at most halves),
  // within the accumulator and panel budgets.
  const int64_t image_cap = HasDepth(g3) ? 1 : std::max<int64_t>(
      1, std::min({CeilDiv(kTaskPixels, l.b.task_rows * l.wo_pad),
                   filter_per_task / std::max<int64_t>(1, panels_per_image),
                   kAccBytes / std::max<int64_t>(1, SatMul(l.acc_elems, int64_t(sizeof(T)))),
                   kImagePanelsBytes /
                       std::max<int64_t>(1, SatMul(l.panel_elems, int64_t(sizeof(T))))}));
  // The ParallelFor splits tasks statically, a block per worker, so tasks
  // past one per worker balance nothing and each packs the filter again:
  // image blocks just enough for every worker, their count rounded up to a
  // multiple of the workers while that is few (17 blocks on 2 workers run
  // as 9 and 8).
  const int64_t w = std::max(workers, 1);
  const int64_t tasks_per_block = std::max<int64_t>(1, l.group_tasks * l.row_blocks);
  int64_t blocks = std::max(CeilDiv(g.batch, image_cap), CeilDiv(w, tasks_per_block));
  if (blocks * tasks_per_block < 4 * w)
    blocks = CeilDiv(RoundUp(blocks * tasks_per_block, w), tasks_per_block);
  blocks = std::clamp<int64_t>(blocks, 1, std::max<int64_t>(g.batch, 1));
  l.b.image_block = std::max<int64_t>(1, CeilDiv(g.batch, blocks));
  l.b.tasks = CeilDiv(g.batch, l.b.image_block) * l.group_tasks * l.row_blocks;
  l.b.lane_utilization = double(std::max<int64_t>(g.out[kW], 1)) / double(l.wo_pad) *
                         double(std::max<int64_t>(cog, 1)) / double(std::max<int64_t>(l.co_pad, 1));
  if (l.b.group_vectors)
    l.b.lane_utilization *= double(g.groups) / double(l.group_tasks * l.b.group_block);
  // Saturating: a layout too large to allocate has a scratch that fits no limit.
  l.b.packed_elements = SatAdd(SatMul(l.b.tasks, filter_per_task),
                               SatMul({g.batch, l.group_tasks, l.row_blocks, panels_per_image}));
  const int64_t per_image = SatAdd(l.panel_elems, l.acc_elems);
  l.b.scratch_bytes_per_worker =
      SatAdd(SatMul(SatAdd(SatMul(l.b.image_block, per_image), l.filter_elems), int64_t(sizeof(T))),
             g.filter[kW] * int64_t(sizeof(int64_t)));
  return l;
}

// dst[0 .. n) = src[0, stride, ...] converted to T; returns dst + n.
template <typename S, typename T>
T* ConvertN(const S* src, int64_t stride, int64_t n, T* dst) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Load<T>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Load<T>(src[i * stride]);
  }
  return dst + n;
}

// dst[0, stride, ...) = src[0 .. n) converted to S.
template <typename S, typename T>
void StoreN(const T* src, int64_t n, S* dst, int64_t stride) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Store<S, T>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = Store<S, T>(src[i]);
  }
}

// What one panel entry holds: a single value (cols kernel), or a block of
// `width` values, a pixel's `n` groups (groups kernel) or input channels
// (chans kernel) `stride` apart in the input, and zeros after them.
struct PanelEntry {
  int64_t width = 1, n = 1, stride = 0;
};

// Copies input rows [ih0, ih0 + rows) x channels [0, nci) into the panel,
// converting to T and writing zeros wherever the window leaves the input.
// Panel entry (ci, row, phase, q) holds input column q*stride_w + phase + iw0.
// Rows and columns are "virtual" ones: with in_dilation u, input sample i
// sits at virtual position i*u and the positions between are zero.
template <typename S, typename T, bool kBlock>
void PackPanel(const S* in, const TensorView& v, const ConvGeometry& g, int64_t ih0,
               int64_t rows, int64_t iw0, int64_t nci, int64_t qlen, int64_t ci_stride,
               int64_t row_stride, int64_t phase_stride, int64_t q_stride, PanelEntry e,
               T* dst) {
  const int64_t sw = g.stride[kW], uh = g.in_dilation[kH], uw = g.in_dilation[kW];
  const int64_t vh = g.virtual_in(kH), vw = g.virtual_in(kW);
  auto zero = [&](T* d) {
    if (kBlock) std::fill_n(d, e.width, T(0));
    else *d = T(0);
  };
  auto copy = [&](T* d, const S* s) {
    if (kBlock) std::fill_n(ConvertN(s, e.stride, e.n, d), e.width - e.n, T(0));
    else *d = Load<T>(*s);
  };
  for (int64_t ci = 0; ci < nci; ++ci) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t ih = ih0 + row;
      const bool row_ok = ih >= 0 && ih < vh && ih % uh == 0;
      for (int64_t ph = 0; ph < sw; ++ph) {
        T* d = dst + ci * ci_stride + row * row_stride + ph * phase_stride;
        // Columns q with 0 <= iw0 + ph + q*sw < vw.
        const int64_t first = iw0 + ph;
        int64_t q_lo = first >= 0 ? 0 : CeilDiv(-first, sw);
        int64_t q_hi = first < vw ? (vw - 1 - first) / sw + 1 : 0;
        q_lo = std::min(q_lo, qlen);
        q_hi = std::clamp(q_hi, q_lo, qlen);
        if (!row_ok) q_lo = q_hi = 0;
        for (int64_t q = 0; q < q_lo; ++q) zero(d + q * q_stride);
        const S* s = in + (ih / uh) * v.h + ci * v.c;
        if (uw == 1) {
          const S* s0 = s + (first + q_lo * sw) * v.w;
          const int64_t step = sw * v.w;
          if (!kBlock && q_stride == 1 && step == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) d[q] = Load<T>(s0[q - q_lo]);
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) copy(d + q * q_stride, s0 + (q - q_lo) * step);
          }
        } else {
          for (int64_t q = q_lo; q < q_hi; ++q) {
            const int64_t iw = first + q * sw;
            if (iw % uw == 0) copy(d + q * q_stride, s + (iw / uw) * v.w);
            else zero(d + q * q_stride);
          }
        }
        for (int64_t q = q_hi; q < qlen; ++q) zero(d + q * q_stride);
      }
    }
  }
}

template <typename S, typename T>
class DirectRunner {
 public:
  DirectRunner(const DirectParams& p, Isa isa, int workers)
      : g_(p.problem.g),
        kt_(Table<T>(isa)),
        l_(MakeLayout(g_, kt_, workers)),
        in_(static_cast<const S*>(p.input)),
        filt_(static_cast<const S*>(p.filter)),
        out_(static_cast<S*>(p.output)),
        iv_(p.problem.in),
        ov_(p.problem.out),
        fv_(p.problem.filter) {}

  void Run(const ParallelFor& parallel_for) {
    parallel_for(l_.b.tasks, [this](int64_t begin, int64_t end, int /*worker*/) {
      const int64_t ib = l_.b.image_block;
      std::vector<T> panel(ib * l_.panel_elems), filt(l_.filter_elems), acc(ib * l_.acc_elems);
      std::vector<int64_t> kw_offset(g_.filter[kW]);
      for (int64_t t = begin; t < end; ++t)
        RunTask(t, panel.data(), filt.data(), acc.data(), kw_offset.data());
    });
  }

 private:
  void RunTask(int64_t task, T* panels, T* filt, T* accs, int64_t* kw_offset) const {
    // Tasks run (block of images, group or block of groups, block of output
    // rows). Each image has its own panel and accumulators in the scratch.
    // In 3-D an image is an (image, output depth) pair, one per task.
    const int64_t rb = task % l_.row_blocks;
    const int64_t grp = (task / l_.row_blocks) % l_.group_tasks * l_.b.group_block;
    const int64_t i0 = task / (l_.row_blocks * l_.group_tasks) * l_.b.image_block;
    const int64_t n0 = i0 / g_.out[kD], od = i0 % g_.out[kD];
    const int64_t images = std::min(l_.b.image_block, g_.batch * g_.out[kD] - i0);
    const int64_t oh0 = rb * l_.b.task_rows;
    const int64_t rows_valid = std::min(l_.b.task_rows, g_.out[kH] - oh0);
    const int64_t cig = g_.in_c_per_group(), cog = g_.out_c_per_group();
    // The groups kernel's block: its real groups, and one vector where that
    // holds them all.
    const int64_t ng = std::min(l_.b.group_block, g_.groups - grp);
    const int gv = ng > l_.lanes ? 2 : 1;
    std::fill(accs, accs + images * l_.acc_elems, T(0));
    Block blk;
    blk.images = images;
    blk.grp = grp;
    blk.rows_valid = rows_valid;
    blk.panels = panels;
    blk.filt = filt;
    blk.accs = accs;
    blk.kw_offset = kw_offset;
    for (int64_t kd = 0; kd < g_.filter[kD]; ++kd) {
      // The (virtual, see in_dilation) input plane of this depth tap; taps
      // on padding or between dilated planes add nothing.
      const int64_t vd = od * g_.stride[kD] - g_.pad_before[kD] + kd * g_.dilation[kD];
      if (vd < 0 || vd >= g_.virtual_in(kD) || vd % g_.in_dilation[kD] != 0) continue;
      blk.in = in_ + n0 * iv_.n + (vd / g_.in_dilation[kD]) * iv_.d + grp * iv_.g;
      blk.filter = filt_ + fv_.offset + kd * fv_.d;
      for (blk.ci0 = 0; blk.ci0 < cig; blk.ci0 += l_.b.ci_block) {
        blk.nci = std::min(l_.b.ci_block, cig - blk.ci0);
        for (blk.kh0 = 0; blk.kh0 < g_.filter[kH]; blk.kh0 += l_.b.kh_block) {
          blk.nkh = std::min(l_.b.kh_block, g_.filter[kH] - blk.kh0);
          blk.rows = l_.PanelRows(blk.nkh, g_);
          blk.ih0 = oh0 * g_.stride[kH] - g_.pad_before[kH] + blk.kh0 * g_.dilation[kH];
          if (l_.b.group_vectors) GroupsBlock(blk, ng, gv);
          else if (l_.b.channel_vectors) ChansBlock(blk);
          else ColsBlock(blk);
        }
      }
    }
    // Write the accumulators out, converting to S.
    // Accumulators [row][col][gb] (groups), [row][col][co_pad] (chans) or
    // [co][row][wo_pad] (cols).
    for (int64_t m = 0; m < images; ++m) {
      const T* acc = accs + m * l_.acc_elems;
      S* out_n = out_ + (n0 + m) * ov_.n + od * ov_.d + oh0 * ov_.h + grp * ov_.g;
      for (int64_t r = 0; r < rows_valid; ++r) {
        S* out_r = out_n + r * ov_.h;
        if (l_.b.group_vectors || l_.b.channel_vectors) {
          const int64_t entry = l_.b.group_vectors ? gv * l_.lanes : l_.co_pad;
          const int64_t n = l_.b.group_vectors ? ng : cog;
          const int64_t stride = l_.b.group_vectors ? ov_.g : ov_.c;
          for (int64_t ow = 0; ow < g_.out[kW]; ++ow)
            StoreN(acc + (r * l_.wo_pad + ow) * entry, n, out_r + ow * ov_.w, stride);
        } else {
          for (int64_t c = 0; c < cog; ++c)
            StoreN(acc + (c * l_.b.task_rows + r) * l_.wo_pad, g_.out[kW], out_r + c * ov_.c,
                   ov_.w);
        }
      }
    }
  }

  // One (input-channel, filter-row) block of a task: what the block kernels
  // pack and run, for each of the task's images.
  struct Block {
    const S* in;  // image 0 of the task, at its group (or block of groups) and depth plane
    const S* filter;  // the filter at the depth tap
    int64_t images, grp, rows_valid;
    int64_t ci0, nci, kh0, nkh;
    int64_t ih0, rows;  // the panel's first input row and its row count
    T* panels;          // an image's panel every panel_elems
    T* filt;
    T* accs;            // an image's accumulators every acc_elems
    int64_t* kw_offset;
  };
  const S* ImageIn(const Block& b, int64_t m) const { return b.in + m * iv_.n + b.ci0 * iv_.c; }
  T* Panel(const Block& b, int64_t m) const { return b.panels + m * l_.panel_elems; }
  T* Acc(const Block& b, int64_t m) const { return b.accs + m * l_.acc_elems; }

  // Filter tap (kh, kw, ci, co) of group grp at the block's depth tap; output
  // channels are fv_.o apart.
  const S* FilterAt(const Block& b, int64_t kh, int64_t kw, int64_t ci, int64_t grp,
                    int64_t co) const {
    return b.filter + kh * fv_.h + kw * fv_.w + ci * fv_.i + grp * fv_.g + co * fv_.o;
  }

  void ColsBlock(const Block& b) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen;
    const int64_t row_stride = sw * qlen, ci_stride = b.rows * row_stride;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, false>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], b.nci, qlen,
                             ci_stride, row_stride, qlen, 1, PanelEntry(), Panel(b, m));
    TapOffsets(qlen, 1, b.kw_offset);
    const int64_t cog = g_.out_c_per_group();
    for (int64_t c0 = 0; c0 < cog; c0 += 4) {
      const int C = int(std::min<int64_t>(4, cog - c0));
      // Filter block [ci][kh][kw][C] for channels c0 .. c0+C.
      PackFilterByChannel(b, c0, fv_.o, C, C);
      const int R = kt_.cols_rows[C];
      ColsTile<T> t;
      t.panel_ci_stride = ci_stride;
      t.out_row_step = g_.stride[kH] * row_stride;
      t.tap_row_step = g_.dilation[kH] * row_stride;
      t.kw_offset = b.kw_offset;
      t.filter = b.filt;
      t.n_ci = b.nci;
      t.n_kh = b.nkh;
      t.n_kw = g_.filter[kW];
      t.acc_c_stride = l_.b.task_rows * l_.wo_pad;
      t.acc_r_stride = l_.wo_pad;
      t.n_colvec = l_.wo_pad / l_.lanes;
      for (int64_t m = 0; m < b.images; ++m)
        for (int64_t r0 = 0; r0 < b.rows_valid; r0 += R) {
          t.panel = Panel(b, m) + r0 * t.out_row_step;
          t.acc = Acc(b, m) + c0 * t.acc_c_stride + r0 * t.acc_r_stride;
          kt_.cols[C](t);
        }
    }
  }

  void ChansBlock(const Block& b) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen;
    const int64_t q_stride = b.nci, phase_stride = qlen * q_stride, row_stride = sw * phase_stride;
    // A panel entry is a pixel's nci channels: one block entry, so that NHWC
    // inputs are copied a pixel's channels at a time, not a channel at a time.
    PanelEntry entry;
    entry.width = entry.n = b.nci;
    entry.stride = iv_.c;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, true>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], 1, qlen, 0,
                            row_stride, phase_stride, q_stride, entry, Panel(b, m));
    TapOffsets(phase_stride, q_stride, b.kw_offset);
    const int64_t cog = g_.out_c_per_group(), KW = g_.filter[kW];
    const int64_t L = l_.lanes;
    ChansTile<T> t;
    t.tap_row_step = g_.dilation[kH] * row_stride;
    t.q_stride = q_stride;
    t.kw_offset = b.kw_offset;
    t.n_ci = b.nci;
    t.n_kh = b.nkh;
    t.n_kw = KW;
    t.acc_col_stride = l_.co_pad;
    t.n_pixgroups = l_.wo_pad / l_.unit;
    // Channel tiles of 2 vectors, the last one of 1 vector if that covers it.
    for (int64_t c0 = 0; c0 < l_.co_pad;) {
      const int CV = l_.co_pad - c0 >= 2 * L ? 2 : 1;
      const int64_t block = CV * L;
      const int64_t n = std::min(block, cog - c0);  // real channels; zero the rest
      T* f = b.filt;  // [kh][kw][ci][block]
      for (int64_t kh = 0; kh < b.nkh; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
          for (int64_t ci = 0; ci < b.nci; ++ci) {
            f = ConvertN(FilterAt(b, b.kh0 + kh, kw, b.ci0 + ci, b.grp, c0), fv_.o, n, f);
            f = std::fill_n(f, block - n, T(0));
          }
      t.filter = b.filt;
      for (int64_t m = 0; m < b.images; ++m)
        for (int64_t r = 0; r < b.rows_valid; ++r) {
          t.panel = Panel(b, m) + r * g_.stride[kH] * row_stride;
          t.acc = Acc(b, m) + r * l_.wo_pad * l_.co_pad + c0;
          kt_.chans[l_.b.narrow_pixels][CV](t);
        }
      c0 += block;
    }
  }

  // The block's filter [ci][kh][kw][width] of taps (kh0 + kh, kw, ci0 + ci)
  // into b.filt: each tap's n values from (grp, c0) on, `stride` apart, then
  // zeros to `width` (the cols kernel's output channels, the groups kernel's groups).
  void PackFilterByChannel(const Block& b, int64_t c0, int64_t stride, int64_t n,
                           int64_t width) const {
    T* f = b.filt;
    for (int64_t ci = 0; ci < b.nci; ++ci)
      for (int64_t kh = 0; kh < b.nkh; ++kh)
        for (int64_t kw = 0; kw < g_.filter[kW]; ++kw)
          f = std::fill_n(
              ConvertN(FilterAt(b, b.kh0 + kh, kw, b.ci0 + ci, b.grp, c0), stride, n, f),
              width - n, T(0));
  }

  // kw_offset[kw]: where filter column kw's inputs start in a panel row, whose
  // entries are ordered (phase, q) for input column q * stride_w + phase.
  void TapOffsets(int64_t phase_stride, int64_t q_stride, int64_t* kw_offset) const {
    for (int64_t kw = 0; kw < g_.filter[kW]; ++kw) {
      const int64_t off = kw * g_.dilation[kW];
      kw_offset[kw] = (off % g_.stride[kW]) * phase_stride + (off / g_.stride[kW]) * q_stride;
    }
  }

  // Groups [grp, grp + ng) of one output channel each, in vectors of
  // gb = gv * lanes groups: panel [ci][row][phase][q][gb], filter
  // [ci][kh][kw][gb], accumulators [row][col][gb].
  void GroupsBlock(const Block& b, int64_t ng, int gv) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen, gb = gv * l_.lanes;
    const int64_t q_stride = gb, phase_stride = qlen * q_stride, row_stride = sw * phase_stride;
    const int64_t ci_stride = b.rows * row_stride;
    PanelEntry entry;
    entry.width = gb;
    entry.n = ng;
    entry.stride = iv_.g;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, true>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], b.nci, qlen,
                            ci_stride, row_stride, phase_stride, q_stride, entry, Panel(b, m));
    TapOffsets(phase_stride, q_stride, b.kw_offset);
    PackFilterByChannel(b, 0, fv_.g, ng, gb);
    direct::GroupsTile<T> t;
    t.panel_ci_stride = ci_stride;
    t.tap_row_step = g_.dilation[kH] * row_stride;
    t.q_stride = q_stride;
    t.kw_offset = b.kw_offset;
    t.filter = b.filt;
    t.n_ci = b.nci;
    t.n_kh = b.nkh;
    t.n_kw = g_.filter[kW];
    t.n_pixgroups = l_.wo_pad / l_.unit;
    for (int64_t m = 0; m < b.images; ++m)
      for (int64_t r = 0; r < b.rows_valid; ++r) {
        t.panel = Panel(b, m) + r * g_.stride[kH] * row_stride;
        t.acc = Acc(b, m) + r * l_.wo_pad * gb;
        kt_.groups[l_.b.narrow_pixels][gv](t);
      }
  }

  const ConvGeometry g_;
  const KernelTable<T>& kt_;
  const Layout l_;
  const S* in_;
  const S* filt_;
  S* out_;
  const TensorView iv_, ov_;
  const FilterView fv_;
};

template <typename S>
void ZeroView(const ConvProblem& p, S* out) {
  const ConvGeometry& g = p.g;
  const S zero = Store<S, float>(0.0f);
  const int64_t cog = g.out_c_per_group();
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t d = 0; d < g.out[kD]; ++d)
      for (int64_t h = 0; h < g.out[kH]; ++h)
        for (int64_t w = 0; w < g.out[kW]; ++w)
          for (int64_t grp = 0; grp < g.groups; ++grp)
            for (int64_t c = 0; c < cog; ++c)
              out[n * p.out.n + d * p.out.d + h * p.out.h + w * p.out.w + grp * p.out.g +
                  c * p.out.c] = zero;
}

template <typename S, typename T>
void RunDirect(const DirectParams& p, const ParallelFor& pf, Isa isa) {
  DirectRunner<S, T>(p, isa, pf.num_workers()).Run(pf);
}

}  // namespace

void ZeroConvOutput(const ConvProblem& p, DType dtype, void* output) {
  switch (dtype) {
    case DType::kFloat: return ZeroView(p, static_cast<float*>(output));
    case DType::kDouble: return ZeroView(p, static_cast<double*>(output));
    case DType::kHalf: return ZeroView(p, static_cast<f16*>(output));
    case DType::kBFloat16: return ZeroView(p, static_cast<bf16*>(output));
  }
}

DirectBlocking DirectConvBlocking(const ConvGeometry& g, DType dtype, Isa isa, int workers) {
  return dtype == DType::kDouble ? MakeLayout(g, Table<double>(isa), workers).b
                                 : MakeLayout(g, Table<float>(isa), workers).b;
}

void DirectConv(const DirectParams& p, const ParallelFor& pf, Isa isa) {
  const ConvGeometry& g = p.problem.g;
  if (g.output_elements() == 0) return;
  if (g.empty_sums()) {
    ZeroConvOutput(p.problem, p.dtype, p.output);
    return;
  }
  switch (p.dtype) {
    case DType::kFloat: return RunDirect<float, float>(p, pf, isa);
    case DType::kDouble: return RunDirect<double, double>(p, pf, isa);
    case DType::kHalf: return RunDirect<f16, float>(p, pf, isa);
    case DType::kBFloat16: return RunDirect<bf16, float>(p, pf, isa);
  }
}

}  // namespace tfbigconv
