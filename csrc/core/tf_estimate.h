// TensorFlow's own kernels as the planner's baseline candidate: their time
// (the cost model's im2col and depthwise tables, cuDNN's GPU model) and their
// workspace (patch matrices, col_buffer, SpaceToBatchND copies).
#pragma once

#include <cstdint>
#include <string>

#include "cost_model.h"
#include "dtypes.h"
#include "estimate.h"
#include "geometry.h"

namespace tfbigconv {

// TensorFlow's own kernel for a case: the baseline candidate. The caller
// (Python) knows which kernel TF runs and whether it can run this case.
enum class TfKernel { kNone, kConv2D, kDepthwiseConv2dNative, kConv3D };
const char* TfKernelName(TfKernel k);  // "tf.Conv2D", ...
struct TfCandidate {
  TfKernel kernel = TfKernel::kNone;  // kNone: TF cannot run this case
  // False: estimated and shown, but auto picks it only once measured (its
  // estimate has been wrong by 100x, e.g. grouped Conv2D on the CPU).
  bool estimate_trusted = true;
  std::string note;                   // why unavailable or untrusted
  // TF runs the kernel through oneDNN (CPU Conv2D: tf_rules.tf_cpu_onednn):
  // other code, with other workspace (TfEstimate).
  bool onednn = false;
};

// How many images' patch matrices TF's CPU Conv2D gradient kernels
// (Conv2DCustomBackpropInput/Filter: TF 2.21 conv_grad_input_ops.h,
// conv_grad_filter_ops.cc) fill their col_buffer with at once: enough for a
// working set of 30 MiB (input) or 32 MiB (filter), at most the batch. The
// input gradient takes one image when one image's work per thread exceeds
// 256 KiB (its parallel contraction). TF allocates the whole shard; only the
// batch's images are ever written, and only written pages use memory.
// 1 for the forward pass. workers: the ParallelFor's (TF's intra-op threads).
int64_t TfColBufferImages(const ConvGeometry& user_g, Pass pass, DType dtype, int workers);

// Bytes of the copies TF's depthwise kernels run on where the filter is
// dilated (conv.py emits them as tf.nn.depthwise_conv2d does: SpaceToBatchND,
// the undilated kernel, BatchToSpaceND); 0 otherwise.
int64_t TfSpaceToBatchBytes(const ConvGeometry& user_g, DType dtype);

// Estimates of TF's kernel for one pass of the user's geometry. CPU Conv2D's
// workspace, measured per pass and host kind (tf.onednn): TF's own (Eigen)
// gradient kernels fill a col_buffer of TfColBufferImages patch matrices of
// out_h * out_w * KH * KW * in_c elements each; Eigen's forward pass and
// oneDNN's three passes build none (a few MiB of scratch: 0).
// DepthwiseConv2dNative: none but TfSpaceToBatchBytes. Conv3D (CPU, 3-D only):
// Conv2D's rates at the side of a square filter with as many taps, workspace
// not modelled (0); cuDNN likewise.
Estimate TfEstimate(const ConvGeometry& user_g, Pass pass, DType dtype, Device device,
                    const TfCandidate& tf, int64_t limit, int workers);

}  // namespace tfbigconv
