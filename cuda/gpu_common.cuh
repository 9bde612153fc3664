// Device helpers shared by the CUDA kernels: storage <-> compute types, the
// kernels' geometry arguments and launch bookkeeping. Half types are stored
// as __half / __nv_bfloat16 (same layout as tfbigconv::f16 / bf16 and TF's
// Eigen types) and compute in float.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "checked_math.h"
#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {
namespace gpu {

template <typename S> struct ComputeOf { using type = S; };
template <> struct ComputeOf<__half> { using type = float; };
template <> struct ComputeOf<__nv_bfloat16> { using type = float; };

// Host and device: kernel bodies written as __host__ __device__ functions
// can also run on the CPU, where tests check their index arithmetic.
#define TFBIGCONV_HD __host__ __device__ __forceinline__

TFBIGCONV_HD float ToCompute(float v) { return v; }
TFBIGCONV_HD double ToCompute(double v) { return v; }
TFBIGCONV_HD float ToCompute(__half v) { return __half2float(v); }
TFBIGCONV_HD float ToCompute(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename S, typename T> TFBIGCONV_HD S FromCompute(T v) { return S(v); }
template <> TFBIGCONV_HD __half FromCompute<__half, float>(float v) { return __float2half_rn(v); }
template <> TFBIGCONV_HD __nv_bfloat16 FromCompute<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

TFBIGCONV_HD int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline int64_t StorageBytes(DType t) {
  return t == DType::kDouble ? 8 : t == DType::kFloat ? 4 : 2;
}

// Blocks for a grid-stride loop over `work` items of `threads` each: kernels
// loop, so the grid only has to be large enough to fill the device.
inline unsigned GridFor(int64_t work, int threads) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  return unsigned(std::max<int64_t>(1, std::min(CeilDiv(work, threads), kMaxBlocks)));
}

// A problem's geometry as the kernels read it, precomputed on the host
// (device code cannot call ConvGeometry's host member functions): the base of
// every kernel's arguments (DirectArgs, FftArgs). Depth (3-D) as in
// geometry.h: out_d, filter_d, stride sd, dilation dd, front padding pf,
// in_dilation ud, virtual input depth vd and effective filter depth eff_d;
// all 1 (pf 0) in 2-D.
struct GeometryArgs {
  TensorView iv, ov;
  FilterView fv;
  int64_t batch, groups, cig, cog, cout, out_h, out_w, filter_h, filter_w;
  int64_t sh, sw, dh, dw, pt, pl, uh, uw, vh, vw, eff_h, eff_w;
  int64_t out_d, filter_d, sd, dd, pf, ud, vd, eff_d;
};

// Fills the GeometryArgs part of a kernel's arguments from its problem.
inline void FillGeometryArgs(const ConvProblem& problem, GeometryArgs* a) {
  const ConvGeometry& g = problem.g;
  a->iv = problem.in;
  a->ov = problem.out;
  a->fv = problem.filter;
  a->batch = g.batch;
  a->groups = g.groups;
  a->cig = g.in_c_per_group();
  a->cog = g.out_c_per_group();
  a->cout = g.out_c;
  a->out_h = g.out[kH];
  a->out_w = g.out[kW];
  a->filter_h = g.filter[kH];
  a->filter_w = g.filter[kW];
  a->sh = g.stride[kH];
  a->sw = g.stride[kW];
  a->dh = g.dilation[kH];
  a->dw = g.dilation[kW];
  a->pt = g.pad_before[kH];
  a->pl = g.pad_before[kW];
  a->uh = g.in_dilation[kH];
  a->uw = g.in_dilation[kW];
  a->vh = g.virtual_in(kH);
  a->vw = g.virtual_in(kW);
  a->eff_h = g.effective_filter(kH);
  a->eff_w = g.effective_filter(kW);
  a->out_d = g.out[kD];
  a->filter_d = g.filter[kD];
  a->sd = g.stride[kD];
  a->dd = g.dilation[kD];
  a->pf = g.pad_before[kD];
  a->ud = g.in_dilation[kD];
  a->vd = g.virtual_in(kD);
  a->eff_d = g.effective_filter(kD);
}

// Element offset of the input depth plane that depth tap kd of output depth
// od reads, or -1 where that plane is padding or falls between the samples
// that in_dilation spreads apart (the tap adds nothing). 0 in 2-D.
TFBIGCONV_HD int64_t InputPlane(const GeometryArgs& a, int64_t od, int64_t kd) {
  const int64_t v = od * a.sd - a.pf + kd * a.dd;
  if (v < 0 || v >= a.vd || v % a.ud != 0) return -1;
  return (v / a.ud) * a.iv.d;
}

// "" or the launch error of the last kernel, named.
inline std::string LaunchError(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// Makes the stream's device current on this thread, so that launches on a
// stream that TensorFlow created go to its context (TF uses primary contexts).
inline std::string ActivateStreamDevice(cudaStream_t stream) {
  int dev = 0;
  cudaError_t e = cudaStreamGetDevice(stream, &dev);
  if (e == cudaSuccess) e = cudaSetDevice(dev);
  if (e != cudaSuccess) return std::string("selecting the stream's device: ") + cudaGetErrorString(e);
  return "";
}

}  // namespace gpu
}  // namespace tfbigconv
