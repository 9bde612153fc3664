// Direct convolution on NVIDIA GPUs: one kernel for any ConvProblem (the
// forward pass, or a gradient posed as a convolution, see geometry.h), so
// forward, backprop_input and backprop_filter share it. No TF headers.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "dtypes.h"
#include "geometry.h"
#include "operands_gpu.h"

namespace tfbigconv {
namespace gpu {

// How the kernel runs a geometry. The tiled kernel stages an input tile plus
// halo in shared memory for a filter sub-block of kb_h x kb_w taps at a time,
// so big filters keep the halo small; each thread holds several outputs
// (rows x columns x channels_per_thread). Geometries whose tile does not fit
// in shared memory even with 1x1 sub-blocks (large strides) use the untiled
// kernel. Long reductions (backprop_filter sums over batch x output pixels)
// are split over input-channel and filter-row ranges into partial sums that
// a second kernel adds in a fixed order: deterministic, no atomics.
//
// 3-D: every kernel runs each (image, output depth) pair as one image and
// the filter's depth taps as reduction rows, in order (ci, kd, kh): the
// filter-row ranges of the splits are ranges of (kd, kh) rows.
//
// Problems with few output pixels and a long reduction (backprop_filter:
// K x K taps, each a sum over N x Ho x Wo) use the reduction kernel instead:
// each thread holds channels_per_thread output channels x width_per_thread
// output columns of one output row, and sums over one range of the
// reduction's (input channel, depth tap, filter row) rows; `row_splits`
// ranges run in parallel into partial sums, added in split order by a
// second kernel.
//
// Problems whose groups are innermost with unit stride in every view and
// have one output channel each, with many groups (NHWC depthwise: the forward
// pass, backprop_input and backprop_filter) use the depthwise kernel: each
// thread holds a vector of neighbouring groups x 4 output columns of one row
// and sums its reduction rows (ci, kd, kh) x all kw, so a warp's loads are
// contiguous vectors. The vector width depends on the operands' alignment
// and is chosen at launch. Rows are split like the reduction kernel's where
// outputs are few (backprop_filter): row_splits, rows_per_split.
struct DirectGpuPlan {
  bool depthwise = false;  // the depthwise kernel where the views allow it
  bool reduction = false;  // the reduction kernel (fields below); else tiled/untiled
  int red_channels = 1;    // output channels per thread: 1, 4 or 8
  int red_width = 4;       // output columns per thread: 4 or 8
  int64_t row_splits = 1, rows_per_split = 1;
  bool tiled = true;
  int kb_h = 1, kb_w = 1;
  int channels_per_thread = 1;  // 1 or 4
  int64_t shared_bytes = 0;
  int64_t ci_splits = 1, ci_per_split = 1;
  int64_t kh_splits = 1, kh_per_split = 1;  // in units of (kd, kb_h filter rows)
  int64_t workspace_bytes = 0;  // partial sums; 0 without splits
  double seconds = 0;           // estimate (uncalibrated model)
  int64_t splits() const { return reduction || depthwise ? row_splits : ci_splits * kh_splits; }
};

// Always succeeds: splits shrink to fit workspace_limit (none needs 0 bytes).
DirectGpuPlan PlanDirectGpu(const ConvProblem& problem, DType dtype, int64_t workspace_limit);

// workspace: plan.workspace_bytes, 16-byte aligned.
struct DirectGpuParams : GpuOperands {
  DirectGpuPlan plan;  // from PlanDirectGpu(problem, dtype, ...)
};

// Enqueues the convolution on `stream`; "" or an error message.
std::string DirectConvGpu(const DirectGpuParams& p, cudaStream_t stream);

// For tests on machines without a GPU: runs the same kernel bodies on the
// CPU, one thread's work at a time, over host pointers. Plans with the tiled
// kernel (shared memory, barriers) are not emulated and return an error.
std::string DirectConvOnHost(const DirectGpuParams& p);

}  // namespace gpu
}  // namespace tfbigconv
