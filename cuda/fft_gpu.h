// FFT convolution on NVIDIA GPUs through cuFFT (loaded at run time), for any
// ConvProblem: forward, backprop_input and backprop_filter. Overlap-save
// tiles as on the CPU (see plan.h): each output tile's input window is
// transformed at fft_h x fft_w (a volume of fft_d x fft_h x fft_w in 3-D),
// channels are mixed per frequency bin, and the inverse transform is cropped
// (and subsampled by the stride) into the output.
// All memory beyond the output is one caller-provided workspace.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <cuda_runtime_api.h>

#include "dtypes.h"
#include "fft_gpu_layout.h"
#include "geometry.h"
#include "operands_gpu.h"

namespace tfbigconv {
namespace gpu {

// The workspace's parts and total (FftGpuLayout, csrc/core/fft_gpu_layout.h:
// filter, input and output spectra, real staging, cuFFT's work area, the
// staging check) come from FftGpuWorkspaceLayout on the fields below.
struct FftGpuPlan : FftGpuLayout {
  int64_t tile_h = 0, tile_w = 0, fft_h = 0, fft_w = 0, tiles_h = 0, tiles_w = 0;
  int64_t tile_d = 1, fft_d = 1, tiles_d = 1;  // depth: 1 in 2-D
  int64_t items = 0;     // batch * tiles_d * tiles_h * tiles_w (image, tile) pairs
  int64_t chunk = 0;     // items transformed at once
  int64_t ci_block = 0;  // input channels per group whose spectra are held at once
  double seconds = 0;  // estimate (uncalibrated model)

  int64_t bins_w() const { return fft_w / 2 + 1; }
  int64_t bins() const { return fft_d * fft_h * bins_w(); }
};

// True if cuFFT could be loaded; otherwise *why says what was tried.
bool CufftAvailable(std::string* why);

// The cheapest plan whose workspace (cuFFT's work area included, which is why
// this needs the stream's device and creates the cuFFT plans) is at most
// workspace_limit. Errors state the minimum workspace needed, or that cuFFT
// is unavailable.
std::string PlanFftGpu(const ConvGeometry& g, DType dtype, int64_t workspace_limit,
                       cudaStream_t stream, FftGpuPlan* plan);

// workspace: plan.workspace_bytes, 256-byte aligned.
struct FftGpuParams : GpuOperands {
  FftGpuPlan plan;  // from PlanFftGpu(problem.g, dtype, ...)
};

// Enqueues the convolution on `stream`; "" or an error message. NaN, Inf and
// input values large enough to overflow the transforms (the bound comes from
// the filter block's largest magnitude, found while staging the filter) are
// found while staging the input; then, after the FFT steps, the call waits
// for the stream and recomputes the output with the direct kernel, which
// places NaN and Inf as tf.nn.conv2d does.
std::string FftConvGpu(const FftGpuParams& p, cudaStream_t stream);

// For tests on machines without a GPU: the same steps on the CPU over host
// pointers, the layout and mixing kernels' bodies in loops and the transforms
// by `fft`, which must do what cuFFT does: `batch` real fft_d x fft_h x fft_w
// volumes to fft_d x fft_h x (fft_w / 2 + 1) complex ones (forward, in the
// compute type), or back (unnormalised). Any plan whose workspace layout is
// consistent runs, not only PlanFftGpu's (sizes need no good factors on the
// CPU).
using HostFft = std::function<std::string(int64_t fft_d, int64_t fft_h, int64_t fft_w,
                                          int64_t batch, bool forward, void* in, void* out)>;
std::string FftConvOnHost(const FftGpuParams& p, const HostFft& fft);

}  // namespace gpu
}  // namespace tfbigconv
