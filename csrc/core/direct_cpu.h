// Tiled direct convolution on the CPU: no im2col, no padded copy of the
// input. Each worker uses a small scratch (a packed filter block, and a packed
// input panel and a float accumulator tile per image of a task, sized by
// DirectBlocking) that stays within a few MiB whatever the tensor sizes.
#pragma once

#include <cstdint>

#include "dtypes.h"
#include "geometry.h"
#include "isa.h"
#include "parallel.h"

namespace tfbigconv {

// What the kernel sees: a convolution problem (geometry and operand views:
// the forward pass, or a gradient posed as a convolution) and raw pointers.
// Half types compute in float.
struct DirectParams {
  ConvProblem problem;
  DType dtype = DType::kFloat;
  const void* input = nullptr;
  const void* filter = nullptr;
  void* output = nullptr;  // fully overwritten
};

// How the direct convolution tiles a problem's geometry (which kernel, task
// and block sizes); exposed for tests and the planner (scratch bytes).
struct DirectBlocking {
  bool channel_vectors = false;  // "chans" kernel (vectors over out channels)
  bool group_vectors = false;    // "groups" kernel (vectors over groups)
  bool narrow_pixels = false;    // chans/groups kernels of 4-pixel groups (narrow outputs)
  int channels_per_tile = 0;     // C (cols), CV (chans) or GV (groups) vectors
  int64_t group_block = 1;       // groups per task (groups kernel: GV x lanes)
  int64_t task_rows = 0;         // output rows per task
  int64_t image_block = 1;       // images per task; they share each packed filter block
  int64_t ci_block = 0, kh_block = 0;
  int64_t tasks = 0;
  int64_t scratch_bytes_per_worker = 0;
  // For the cost model: the share of vector lanes doing useful work (output
  // columns or channels padded to whole vectors), and the elements all tasks
  // pack (each task packs its group's whole filter, and its images' input panels).
  double lane_utilization = 1;
  int64_t packed_elements = 0;
};

// workers: the ParallelFor's num_workers() (image blocks are sized for them;
// the results do not depend on it).
DirectBlocking DirectConvBlocking(const ConvGeometry& g, DType dtype, Isa isa, int workers);

// Writes zeros to every output element of the problem (empty reductions).
void ZeroConvOutput(const ConvProblem& p, DType dtype, void* output);

// Runs the problem with the given ISA (must be in SupportedIsas()).
void DirectConv(const DirectParams& p, const ParallelFor& parallel_for, Isa isa);

}  // namespace tfbigconv
