// The GPU FFT's workspace layout (cuda/fft_gpu.cu), in one place for all who
// size it: the GPU planner (PlanFftGpu), the launcher that carves the
// workspace into its parts (fft_gpu.cu, Run), the CUDA harness's host runs
// (cuda/harness) and the trace-time planner's lower bound (gpu_estimate.cc, which
// must not depend on CUDA). Header-only and free of CUDA headers, so that the
// core, the CUDA library and the TF-free harness all use it as it is.
//
// Sizes saturate (checked_math.h): a plan too large to allocate needs a
// workspace that fits no limit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "checked_math.h"
#include "dtypes.h"
#include "fft_sizes.h"
#include "geometry.h"

namespace tfbigconv {

// Every part of the workspace starts on this boundary.
constexpr int64_t kFftGpuAlign = 256;

// The last part of every workspace: the staging check (fft_gpu.cu,
// StagingCheck: the filter block's largest magnitude and whether an input
// window failed).
constexpr int64_t kFftGpuStagingCheckBytes = 256;

inline int64_t FftGpuAlignUp(int64_t bytes) {
  return SatAdd(bytes, kFftGpuAlign - 1) / kFftGpuAlign * kFftGpuAlign;
}

// The three transform batches of a plan: the filter spectra of one block of
// ci_block input channels per group, and the input and output spectra of one
// chunk of `chunk` items ((image, tile) pairs; a tile is a volume in 3-D).
struct FftGpuBatches {
  int64_t filter, input, output;
};
inline FftGpuBatches FftGpuBatchesOf(const ConvGeometry& g, int64_t chunk, int64_t ci_block) {
  return {SatMul(g.out_c, ci_block), SatMul({chunk, g.groups, ci_block}), SatMul(chunk, g.out_c)};
}

// One spectrum: fft_d x fft_h x (fft_w / 2 + 1) complex values of the
// compute type (fft_d is 1 in 2-D).
inline int64_t FftGpuSpectrumBytes(int64_t fft_d, int64_t fft_h, int64_t fft_w, DType dtype) {
  return SatMul({fft_d, fft_h, fft_w / 2 + 1, 2 * int64_t(ComputeBytes(dtype))});
}

// The workspace of one plan: its parts' sizes, in this order, each
// kFftGpuAlign-aligned: filter spectra, input spectra, output spectra, real
// staging planes (for the largest batch), cuFFT's work area, and the staging
// check last.
struct FftGpuLayout {
  int64_t wspec_bytes = 0, xspec_bytes = 0, yspec_bytes = 0, real_bytes = 0, work_bytes = 0;
  int64_t workspace_bytes = 0;  // the exact total

  // Where each part starts in the workspace.
  int64_t wspec_offset() const { return 0; }
  int64_t xspec_offset() const { return wspec_bytes; }
  int64_t yspec_offset() const { return xspec_offset() + xspec_bytes; }
  int64_t real_offset() const { return yspec_offset() + yspec_bytes; }
  int64_t work_offset() const { return real_offset() + real_bytes; }
  int64_t check_offset() const { return workspace_bytes - kFftGpuStagingCheckBytes; }
};

// The layout of a plan with transforms of fft_d x fft_h x fft_w, `chunk`
// items and `ci_block` input channels per group at a time, and a cuFFT work
// area of cufft_work_bytes (an estimate while planning, cuFFT's own figure
// once the plans exist, 0 where no cuFFT runs: the harness's host runs).
inline FftGpuLayout FftGpuWorkspaceLayout(const ConvGeometry& g, DType dtype, int64_t fft_d,
                                          int64_t fft_h, int64_t fft_w, int64_t chunk,
                                          int64_t ci_block, int64_t cufft_work_bytes) {
  const FftGpuBatches b = FftGpuBatchesOf(g, chunk, ci_block);
  const int64_t spectrum = FftGpuSpectrumBytes(fft_d, fft_h, fft_w, dtype);
  const int64_t plane = SatMul({fft_d, fft_h, fft_w, int64_t(ComputeBytes(dtype))});
  FftGpuLayout l;
  l.wspec_bytes = FftGpuAlignUp(SatMul(b.filter, spectrum));
  l.xspec_bytes = FftGpuAlignUp(SatMul(b.input, spectrum));
  l.yspec_bytes = FftGpuAlignUp(SatMul(b.output, spectrum));
  l.real_bytes = FftGpuAlignUp(SatMul(std::max({b.filter, b.input, b.output}), plane));
  l.work_bytes = FftGpuAlignUp(cufft_work_bytes);
  l.workspace_bytes = kFftGpuStagingCheckBytes;
  for (int64_t part : {l.wspec_bytes, l.xspec_bytes, l.yspec_bytes, l.real_bytes, l.work_bytes})
    l.workspace_bytes = SatAdd(l.workspace_bytes, part);
  return l;
}

// A lower bound of every GPU FFT plan's workspace, for the trace-time planner
// (gpu_estimate.cc), which cannot ask cuFFT: the smallest transform (the first tile
// candidate, GoodFftSize of the effective filter), one item and one input
// channel per group at a time; of its layout, the filter and output spectra,
// one input spectrum and a cuFFT work area of one spectrum (the planning
// estimate's least, PlanFftGpu); the real staging planes, the alignment and
// the staging check are left out. The run-time plan is at least this big.
inline int64_t FftGpuMinWorkspaceBytes(const ConvGeometry& g, DType dtype) {
  const int64_t spectrum =
      FftGpuSpectrumBytes(GoodFftSize(g.effective_filter(kD)), GoodFftSize(g.effective_filter(kH)),
                          GoodFftSize(g.effective_filter(kW)), dtype);
  const FftGpuBatches b = FftGpuBatchesOf(g, /*chunk=*/1, /*ci_block=*/1);
  return SatMul(SatAdd(SatAdd(b.filter, b.output), 2), spectrum);
}

}  // namespace tfbigconv
