// The FFT's tiling: overlap-save tiles, chunks of items, reduction blocks
// and staged planes, with the exact workspace each plan needs (the kernels
// allocate exactly FftPlan::workspace_bytes, and PlanFft never returns a plan
// above the caller's limit); and the fused 1-D backward's plan.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {

// Overlap-save FFT convolution of one pass. The output of each image is cut
// into tiles of tile_d x tile_h x tile_w pixels (tile_d = fft_d = 1 in 2-D);
// each tile's input window (with its halo) is transformed at fft_d x fft_h x
// fft_w. "Items" are (image, tile) pairs, processed chunk at a time.
struct FftPlan {
  int64_t tile_d = 1, tile_h = 0, tile_w = 0;
  int64_t fft_d = 1, fft_h = 0, fft_w = 0;
  int64_t tiles_d = 1, tiles_h = 0, tiles_w = 0;
  int64_t items = 0;   // batch * tiles_d * tiles_h * tiles_w
  int64_t chunk = 0;   // items per chunk
  int workers = 0;     // per-worker buffers, one per ParallelFor worker id
  // Input channels per group whose spectra are held at once. Below
  // in_c/groups, the sum over input channels runs in blocks, accumulating
  // output spectra, so that the filter spectra (ci_block * out_c of them)
  // fit the limit: this bounds the gradient with respect to the filter,
  // whose "input channels" are the batch.
  int64_t ci_block = 0;
  // With few input channels per group (and one block), each output spectrum is mixed right
  // before its inverse transform in a per-worker buffer, while it is in
  // cache; otherwise all output spectra of a chunk are mixed in one pass
  // over frequency blocks, reading each filter spectrum once per chunk.
  bool fused_mix = false;
  // Channel planes one task stages together (at least 1): adjacent channels
  // of an NHWC tensor share cache lines, so a block of them is read and
  // written row by row while those lines are in L1.
  int64_t stage_planes = 0;
  // Lane transforms (LaneFftPlan, set by FillFftWorkspace): stage_planes
  // counts lanes, in groups of kFftLanes.
  bool lanes = false;
  // Workspace layout, in this order; all sizes in bytes.
  int64_t filter_spectra_bytes = 0;     // ci_block * out_c spectra (lane plans: halfcomplex lane groups, or none)
  int64_t item_spectra_bytes = 0;       // groups * ci_block (+ out_c unless fused) spectra of one item (none if PlaneLocalFft)
  int64_t worker_bytes = 0;             // one worker's stage_planes real planes (+ a spectrum if fused, one per plane at height 1; lane plans: LaneWorkerBuffers)
  int64_t workspace_bytes = 0;          // the exact total
  // The cost model's inputs: transform and channel-mixing flops, and bytes
  // moved through memory; and their weighted sum, in seconds (CostModel).
  double transform_flops = 0, mix_flops = 0, bytes = 0;
  double cost = 0;

  int64_t bins_w() const { return fft_w / 2 + 1; }
  int64_t ci_blocks(const ConvGeometry& g) const {
    return (g.in_c_per_group() + ci_block - 1) / ci_block;
  }
  int64_t bins() const { return fft_d * fft_h * bins_w(); }
};

// The most planes FftPlan::stage_planes may hold (fft_plan.cc,
// PreferredStagePlanes, has the rules): 16 float32 channels fill a pixel's
// cache line, and 3-D volumes take that many. Plans of height 1 (1-D problems),
// whose rows ducc0 transforms together, take up to 64: each block walks the
// whole input once, and in NWC with many channels fewer walks were 7% of the
// Hyena case's three passes (16 -> 64 planes). 2-D plans take up to 8, whose
// planes' rows are staged together within about 384 KiB (kStageBytes).
constexpr int64_t kMaxStagePlanes1D = 64;
constexpr int64_t kMaxStagePlanes3D = 16;
constexpr int64_t kMaxStagePlanes2D = 8;
// The most of the three: the kernels' per-block arrays are this long.
constexpr int64_t kMaxStagePlanes =
    std::max({kMaxStagePlanes1D, kMaxStagePlanes3D, kMaxStagePlanes2D});

// Input channels per group up to which FftPlan::fused_mix is used.
constexpr int64_t kFusedMixMaxInChannels = 4;

// Groups that a lane plan transforms together (LaneFftPlan): a vector of
// eight float32 values is a cache line's half, and a group's buffer holds
// kFftLanes rows whatever the ISA's vector width (fft::LaneFft, a divisor).
constexpr int64_t kFftLanes = 8;

// Whether a plan runs lane transforms (fft_cpu_lanes.cc, LaneRunner): 1-D, every
// output channel alone in its group, at least kFftLanes groups, and either
// one input channel per group (depthwise: the filter's spectra are made once
// for all items) or one item whose task sums over all input channels of its
// groups (the filter gradient of a depthwise convolution). Lanes are adjacent
// groups, which an NWC tensor holds side by side: a task reads and writes
// whole cache lines, and ducc0 transforms the staged positions as its SIMD
// vectors, with no transposes and no item spectra.
inline bool LaneFftPlan(const ConvGeometry& g, const FftPlan& p) {
  return p.fft_h == 1 && p.fft_d == 1 && g.out_c_per_group() == 1 && g.groups >= kFftLanes &&
         (g.in_c_per_group() == 1 || (p.items == 1 && p.ci_block >= g.in_c_per_group()));
}

// A lane plan's groups per task (from stage_planes, which counts lanes), and
// the buffers of kFftLanes x fft_w reals a worker holds: the task's groups
// (three sets when the task sums input channels: input, filter and sum), then
// two for the transforms' scratch (ducc0 needs at most 1.1 x the points for
// 7-smooth sizes; LaneRunner checks). The filter's lane spectra, when made once,
// take a buffer per group.
constexpr int64_t kMaxLaneGroupsPerTask = kMaxStagePlanes1D / kFftLanes;
inline int64_t LaneGroupsPerTask(const FftPlan& p) {
  return std::min(kMaxLaneGroupsPerTask, std::max<int64_t>(1, p.stage_planes / kFftLanes));
}
inline int64_t LaneWorkerBuffers(const ConvGeometry& g, const FftPlan& p) {
  return (g.in_c_per_group() == 1 ? 1 : 3) * LaneGroupsPerTask(p) + 2;
}
// Workspace regions start 64-byte aligned in a lane plan (the transforms'
// vectors need it): each region holds this much slack.
constexpr int64_t kLaneAlignBytes = 64;

// Whether output channel co of a plan needs input plane co alone (depthwise,
// one output per channel) and the worker holds a spectrum per staged plane
// (1-D) in a plan too narrow for lanes: then one task transforms, mixes and
// inverts each block of planes in its worker's spectra, and the plan needs no
// item spectra.
inline bool PlaneLocalFft(const ConvGeometry& g, const FftPlan& p) {
  return p.fft_h == 1 && p.fft_d == 1 && p.fused_mix && g.in_c_per_group() == 1 &&
         g.out_c_per_group() == 1 && !LaneFftPlan(g, p);
}

// Workspace of a plan with the given tile, chunk and workers (fills the byte
// fields of *plan from its tile and fft sizes).
void FillFftWorkspace(const ConvGeometry& g, DType dtype, FftPlan* plan);

// The cheapest plan whose workspace is at most workspace_limit bytes. On
// failure returns an error that states the minimum workspace needed.
std::string PlanFft(const ConvGeometry& g, DType dtype, int64_t workspace_limit,
                           int workers, FftPlan* plan);

// Both gradients of a 1-D depthwise convolution from one transform of
// dL/doutput (fft_cpu.h, FftLaneBackprop): a task takes LaneGroupsPerTask
// groups of kFftLanes channels and, image by image, transforms dL/doutput
// (placed at the output positions times the stride) and the input (placed
// after the left padding) once each; dL/dinput is dL/doutput's spectrum
// times the filter's, and dL/dfilter sums the input's times dL/doutput's
// conjugate over the images. The transforms cover the whole row: fft_w >=
// max(pad_left + in_w, (out_w - 1) * stride_w + effective filter), so that
// neither product wraps onto the values kept.
struct LaneBackpropPlan {
  int64_t fft_w = 0;
  int64_t stage_planes = 0;  // lanes a task stages, a multiple of kFftLanes
  int workers = 0;
  int64_t worker_bytes = 0;     // (4 x its groups + 2) group buffers, + kLaneAlignBytes
  int64_t workspace_bytes = 0;  // workers x worker_bytes
};

// Fills *plan and returns "" where the fused backward serves the forward
// geometry g: 1-D (depth, height and filter 1 with no padding there),
// depthwise with one output per channel, at least kFftLanes channels, a
// dL/dinput the separate pass would transform whole (PlanFft: one tile per
// image, so that whole-row transforms are no larger than its), within the
// limit. Else returns why not.
std::string PlanLaneBackprop(const ConvGeometry& g, DType dtype, int64_t workspace_limit,
                             int workers, LaneBackpropPlan* plan);

}  // namespace tfbigconv
