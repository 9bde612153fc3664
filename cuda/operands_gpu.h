// What the params of every GPU kernel share: the problem and its operands.
// DirectGpuParams and FftGpuParams extend it with their plan, so a launcher
// fills the operands once (run_gpu.cc) and hands them to either kernel.
#pragma once

#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {
namespace gpu {

struct GpuOperands {
  ConvProblem problem;  // the forward pass, or a gradient posed as a convolution
  DType dtype = DType::kFloat;
  const void* input = nullptr;  // device pointers (host ones in the *OnHost tests)
  const void* filter = nullptr;
  void* output = nullptr;       // fully overwritten
  void* workspace = nullptr;    // the plan's workspace_bytes
};

}  // namespace gpu
}  // namespace tfbigconv
