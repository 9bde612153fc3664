#include "direct_cpu_layout.h"

#include <algorithm>

namespace tfbigconv {
namespace direct {
namespace {

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

}  // namespace

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

template Layout MakeLayout<float>(const ConvGeometry&, const KernelTable<float>&, int);
template Layout MakeLayout<double>(const ConvGeometry&, const KernelTable<double>&, int);

}  // namespace direct
}  // namespace tfbigconv
