// The floor of an FFT pass (benchmarks/bench_floor.py, docs/planner.md): the
// transforms its plan cannot avoid, run alone by the kernels' own FFT calls
// at the plan's sizes on the same threads, with no staging, mixing or
// write-back. Internal to the core and the benchmarks.
#pragma once

#include <cstdint>

#include "dtypes.h"
#include "fft_plan.h"
#include "geometry.h"
#include "parallel.h"

namespace tfbigconv {

// Which of the pass problem's filter transforms the floor counts.
enum class FloorFilter {
  kCached,  // the filter is the weights: one transform per step could serve every pass
  kData,    // the filter is data (dL/doutput in the filter gradient): transformed per call
};

struct FftFloorTiming {
  double seconds = 0;     // wall time of the transforms, all workers together
  double flops = 0;       // 5 n log2 n per complex 1-D transform of n points, half for real
  int64_t transforms = 0; // whole-plane (2-D, 3-D) or lane-group transforms run
};

// Times the floor of plan (from PlanFft for g, the pass's problem geometry,
// for at least pf's workers): per item, the forward transform of each input
// plane, pruned to the window's rows and slices that hold input as
// FftConv's are, and the inverse of each output plane, pruned to the rows
// and slices the tile keeps; per call, the filter's transforms where
// `filter` is kData. Lane plans: each lane group's forward and inverse
// transform (and, summing input channels, the input's per channel). Buffers
// are the workers' own, allocated and filled before the clock starts.
FftFloorTiming TimeFftFloor(const ConvGeometry& g, DType dtype, const FftPlan& plan,
                            FloorFilter filter, const ParallelFor& pf);

// The same for the fused 1-D backward (FftLaneBackprop) of the forward
// geometry g: per image and lane group the transforms of dL/doutput and of
// the input and the inverse of dL/dinput, then per lane group the inverse of
// dL/dfilter. The filter's (the weights') transforms are not counted.
FftFloorTiming TimeLaneBackpropFloor(const ConvGeometry& g, DType dtype,
                                     const LaneBackpropPlan& plan, const ParallelFor& pf);

}  // namespace tfbigconv
