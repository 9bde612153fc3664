#include "fft_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cufft_loader.h"
#include "direct_gpu.h"
#include "fft_sizes.h"
#include "gpu_common.cuh"

namespace tfbigconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Input and output spectra of one chunk beyond which bigger chunks buy
// nothing: each transform launch is already large enough to fill the GPU.
constexpr int64_t kChunkTargetBytes = int64_t(1) << 30;
// Uncalibrated model constants (H100-class): FFT flop rate and memory bandwidth.
constexpr double kFftFlopsPerSecond = 10e12, kBytesPerSecond = 2e12;

// ---- cuFFT plans, cached per (device, stream, size, batch, type) ----------

struct PlanKey {
  int device;
  cudaStream_t stream;
  int64_t d, h, w, batch;
  int type;
  bool operator<(const PlanKey& o) const {
    return std::tie(device, stream, d, h, w, batch, type) <
           std::tie(o.device, o.stream, o.d, o.h, o.w, o.batch, o.type);
  }
};
struct CachedPlan {
  cufftHandle handle;
  size_t work_bytes;
};

// Setting a plan's stream and work area and enqueueing it happen under this
// mutex, so concurrent ops never race on one handle.
std::mutex& PlanMutex() {
  static std::mutex m;
  return m;
}
std::map<PlanKey, CachedPlan>& PlanCache() {
  static auto* cache = new std::map<PlanKey, CachedPlan>();
  return *cache;
}

// Caller holds PlanMutex(). Transforms of d x h x w: 2-D ones where d is 1,
// 1-D ones where h is 1 too (the same layout; cuFFT's 1-D kernels are faster).
std::string GetPlan(const CufftApi& api, cudaStream_t stream, int64_t d, int64_t h, int64_t w,
                    int64_t batch, int type, CachedPlan* out) {
  int device = 0;
  cudaError_t ce = cudaGetDevice(&device);
  if (ce != cudaSuccess) return std::string("cudaGetDevice: ") + cudaGetErrorString(ce);
  const PlanKey key{device, stream, d, h, w, batch, type};
  auto it = PlanCache().find(key);
  if (it != PlanCache().end()) {
    *out = it->second;
    return "";
  }
  CachedPlan p{};
  cufftResult r = api.Create(&p.handle);
  if (r != CUFFT_SUCCESS) return "cufftCreate failed with code " + std::to_string(int(r));
  long long n[3] = {d, h, w};
  const int rank = d > 1 ? 3 : (h > 1 ? 2 : 1);
  r = api.SetAutoAllocation(p.handle, 0);
  if (r == CUFFT_SUCCESS)
    r = api.MakePlanMany64(p.handle, rank, n + 3 - rank, nullptr, 1, 0, nullptr, 1, 0,
                           cufftType(type), batch, &p.work_bytes);
  if (r != CUFFT_SUCCESS) {
    api.Destroy(p.handle);
    return "cuFFT plan for " + std::to_string(batch) + " transforms of " + std::to_string(d) +
           "x" + std::to_string(h) + "x" + std::to_string(w) + " failed with code " +
           std::to_string(int(r));
  }
  PlanCache()[key] = p;
  *out = p;
  return "";
}

std::string Exec(const CufftApi& api, cudaStream_t stream, int64_t d, int64_t h, int64_t w,
                 int64_t batch, bool forward, bool dbl, void* in, void* out, void* work) {
  const int type = forward ? (dbl ? CUFFT_D2Z : CUFFT_R2C) : (dbl ? CUFFT_Z2D : CUFFT_C2R);
  std::lock_guard<std::mutex> lock(PlanMutex());
  CachedPlan p;
  std::string err = GetPlan(api, stream, d, h, w, batch, type, &p);
  if (!err.empty()) return err;
  cufftResult r = api.SetStream(p.handle, stream);
  if (r == CUFFT_SUCCESS) r = api.SetWorkArea(p.handle, work);
  if (r == CUFFT_SUCCESS) {
    if (forward) r = dbl ? api.ExecD2Z(p.handle, in, out) : api.ExecR2C(p.handle, in, out);
    else r = dbl ? api.ExecZ2D(p.handle, in, out) : api.ExecC2R(p.handle, in, out);
  }
  if (r != CUFFT_SUCCESS) return "cuFFT execution failed with code " + std::to_string(int(r));
  return "";
}

// The three transform batches of a plan: filter spectra, input spectra,
// inverse of output spectra (csrc/core/fft_gpu_layout.h).
FftGpuBatches BatchesOf(const ConvGeometry& g, const FftGpuPlan& p) {
  return FftGpuBatchesOf(g, p.chunk, p.ci_block);
}

// ---- kernels -----------------------------------------------------------

template <typename T> struct Complex;
template <> struct Complex<float> { using type = float2; };
template <> struct Complex<double> { using type = double2; };

// The geometry (GeometryArgs, gpu_common.cuh) and the plan's tiling. In 3-D
// a tile is a volume and every "plane" of the staging below a volume of
// fft_d planes; tile_d, tiles_d and fft_d are 1 in 2-D.
struct FftArgs : GeometryArgs {
  int64_t tile_h, tile_w, tiles_h, tiles_w, fft_h, fft_w, bins, ci_block, chunk;
  int64_t tile_d, tiles_d, fft_d;
};

// Where item `item`'s tile sits: its first output (od0, oh0, ow0) and its
// valid extent (vd, vh, vw), smaller at the output's far edges.
struct Tile {
  int64_t n, od0, oh0, ow0, vd, vh, vw;
};
TFBIGCONV_HD Tile TileOf(const FftArgs& a, int64_t item) {
  const int64_t per_plane = a.tiles_h * a.tiles_w, per_image = a.tiles_d * per_plane;
  const int64_t t = item % per_image, th_tw = t % per_plane;
  Tile r;
  r.n = item / per_image;
  r.od0 = (t / per_plane) * a.tile_d;
  r.oh0 = (th_tw / a.tiles_w) * a.tile_h;
  r.ow0 = (th_tw % a.tiles_w) * a.tile_w;
  r.vd = Min64(a.tile_d, a.out_d - r.od0);
  r.vh = Min64(a.tile_h, a.out_h - r.oh0);
  r.vw = Min64(a.tile_w, a.out_w - r.ow0);
  return r;
}

// The staging check (the workspace's last kFftGpuStagingCheckBytes): the current
// filter block's largest magnitude, as the bits of the compute type (for
// non-negative values the bits order as the values; NaN's are the largest),
// and a flag set when an input window holds a value the FFT must not take.
struct StagingCheck {
  unsigned long long filter_max_bits;
  unsigned int unsafe;
};
static_assert(sizeof(StagingCheck) <= kFftGpuStagingCheckBytes, "staging check too big");

template <typename T>
TFBIGCONV_HD unsigned long long MagnitudeBits(T v) {
  const T m = v < T(0) ? -v : v;  // NaN keeps its bits, which order above Inf's
  if constexpr (sizeof(T) == 4) {
    unsigned int b;
    memcpy(&b, &m, 4);
    return b;
  } else {
    unsigned long long b;
    memcpy(&b, &m, 8);
    return b;
  }
}

template <typename T>
TFBIGCONV_HD T FromMagnitudeBits(unsigned long long bits) {
  T v;
  if constexpr (sizeof(T) == 4) {
    const unsigned int b = static_cast<unsigned int>(bits);
    memcpy(&v, &b, 4);
  } else {
    memcpy(&v, &bits, 8);
  }
  return v;
}

// Called by every lane of a warp with its own maximum. On the GPU the lanes'
// maxima meet by shuffles first and one lane per warp does the atomic: an
// atomic per lane serialised on this one address (about 2.5e9 a second on an
// H100) and was most of the filter staging's time where the "filter" is
// large (dL/dfilter's dy: 1.4 ms of 1.7 for a (8,56,56,128) depthwise layer).
template <typename T>
TFBIGCONV_HD void RaiseFilterMax(StagingCheck* check, T m) {
  unsigned long long bits = MagnitudeBits(m);
#ifdef __CUDA_ARCH__
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, bits, offset);
    bits = other > bits ? other : bits;
  }
  if (bits != 0 && threadIdx.x % 32 == 0) atomicMax(&check->filter_max_bits, bits);
#else
  if (bits > check->filter_max_bits) check->filter_max_bits = bits;
#endif
}

// The largest input magnitude the transforms take safely with filter values
// up to the block's maximum (as on the CPU, fft_cpu.cc: spectra grow by up to
// the transform's points, the mix sums cig products of two, the unnormalised
// inverse grows by the points again; a factor 2 to spare). Negative when the
// filter holds a NaN or Inf: every staged value then fails.
template <typename T>
TFBIGCONV_HD T InputLimit(const FftArgs& a, unsigned long long w_bits) {
  const T big = sizeof(T) == 4 ? T(3.4028234663852886e38) : T(1.7976931348623157e308);
  const T w_max = FromMagnitudeBits<T>(w_bits);
  if (!(w_max <= big)) return T(-1);
  if (w_max == T(0)) return big;
  const double points = double(a.fft_d) * double(a.fft_h) * double(a.fft_w);
  const double growth = 4.0 * points * points * double(a.cig) * double(a.filter_d) *
                        double(a.filter_h) * double(a.filter_w) * double(w_max);
  const double limit = double(big) / growth;
  return limit < double(big) ? T(limit) : big;
}

// The layout kernels below give each warp one segment of a row of a plane
// (grid-stride over rows and segments) and its lanes consecutive columns: the
// row's index arithmetic is done once per segment rather than per element,
// and loads and stores coalesce. Rows are cut into segments of at most
// kSegmentCols columns so that long rows (1-D: one row of 2L columns per
// plane) still give every SM warps. Their bodies (one segment, one lane; one
// item for the mix) are host-device functions, so that FftConvOnHost can run
// them on the CPU for tests.
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kLanes = 32;
constexpr int64_t kSegmentCols = 2048;
// The crop writes every output channel of its columns: shorter segments and
// blocks of channels, as few rows of many channels (1-D) are common.
constexpr int64_t kCropSegmentCols = 256;
constexpr int64_t kCropChannels = 64;
// The mix kernel gives a thread all output channels when they are few.
constexpr int64_t kMixMacsPerThread = 64;

// A warp's share of a row: columns [begin, end).
struct Segment {
  int64_t begin, end;
};

inline unsigned GridForRows(int64_t rows, int64_t width, int64_t seg_cols) {
  return GridFor(SatMul(rows, CeilDiv(width, seg_cols)), kWarpsPerBlock);
}

// Runs body(row, segment, lane) for every row and segment of width columns.
#define TFBIGCONV_WARP_ROWS(rows, width, seg_cols, body)                                       \
  for (int64_t unit = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / kLanes,            \
               segs = ((width) + (seg_cols) - 1) / (seg_cols);                                 \
       unit < (rows) * segs; unit += gridDim.x * int64_t(kWarpsPerBlock))                      \
    body(unit / segs,                                                                          \
         Segment{(unit % segs) * (seg_cols), Min64((width), (unit % segs + 1) * (seg_cols))},  \
         int(threadIdx.x % kLanes))

// real[co][ci][z][r][c] = dilated filter taps (co, ci0 + ci) at the origin.
template <typename S, typename T>
TFBIGCONV_HD void PadFilterRow(const FftArgs& a, const S* filt, int64_t ci0, int64_t nci, T* real,
                               StagingCheck* check, int64_t row, Segment seg, int lane) {
  const int64_t r = row % a.fft_h;
  int64_t t = row / a.fft_h;
  const int64_t z = t % a.fft_d;
  t /= a.fft_d;
  const int64_t ci = t % a.ci_block, co = t / a.ci_block;
  T* dst = real + row * a.fft_w;
  const bool live = ci < nci && r % a.dh == 0 && r / a.dh < a.filter_h && z % a.dd == 0 &&
                    z / a.dd < a.filter_d;
  const S* src = live ? filt + a.fv.offset + (z / a.dd) * a.fv.d + (r / a.dh) * a.fv.h +
                            (ci0 + ci) * a.fv.i + (co / a.cog) * a.fv.g + (co % a.cog) * a.fv.o
                      : nullptr;
  T m = T(0);
  for (int64_t c = seg.begin + lane; c < seg.end; c += kLanes) {
    T v = T(0);
    if (src && c % a.dw == 0 && c / a.dw < a.filter_w) v = ToCompute(src[(c / a.dw) * a.fv.w]);
    dst[c] = v;
    const T av = v < T(0) ? -v : v;
    m = (av > m || av != av) ? av : m;  // NaN, once seen, stays
  }
  RaiseFilterMax(check, m);  // every lane of the warp gets here (no early return above)
}

template <typename S, typename T>
__global__ void PadFilterKernel(FftArgs a, const S* filt, int64_t ci0, int64_t nci, T* real,
                                StagingCheck* check) {
  auto body = [&](int64_t row, Segment seg, int lane) {
    PadFilterRow(a, filt, ci0, nci, real, check, row, seg, lane);
  };
  TFBIGCONV_WARP_ROWS(a.cout * a.ci_block * a.fft_d * a.fft_h, a.fft_w, kSegmentCols, body);
}

// real[slot][grp][ci][z][r][c] = the tile's input window (virtual input:
// zero in the padding and between in_dilation's samples), zero beyond it.
template <typename S, typename T>
TFBIGCONV_HD void PadInputRow(const FftArgs& a, const S* in, int64_t item0, int64_t n_items,
                              int64_t ci0, int64_t nci, T* real, StagingCheck* check,
                              int64_t row, Segment seg, int lane) {
  const int64_t r = row % a.fft_h;
  int64_t t = row / a.fft_h;
  const int64_t z = t % a.fft_d;
  t /= a.fft_d;
  const int64_t ci = t % a.ci_block;
  t /= a.ci_block;
  const int64_t grp = t % a.groups, slot = t / a.groups;
  T* dst = real + row * a.fft_w;
  // This row's source, and the window of columns [0, need_w) it may fill.
  const S* src = nullptr;
  int64_t vc0 = 0, need_w = 0;
  if (slot < n_items && ci < nci) {
    const Tile tl = TileOf(a, item0 + slot);
    const int64_t need_d = (tl.vd - 1) * a.sd + a.eff_d, need_h = (tl.vh - 1) * a.sh + a.eff_h;
    const int64_t vz = tl.od0 * a.sd - a.pf + z, vr = tl.oh0 * a.sh - a.pt + r;
    if (z < need_d && vz >= 0 && vz < a.vd && vz % a.ud == 0 && r < need_h && vr >= 0 &&
        vr < a.vh && vr % a.uh == 0) {
      src = in + tl.n * a.iv.n + grp * a.iv.g + (ci0 + ci) * a.iv.c + (vz / a.ud) * a.iv.d +
            (vr / a.uh) * a.iv.h;
      vc0 = tl.ow0 * a.sw - a.pl;
      need_w = (tl.vw - 1) * a.sw + a.eff_w;
    }
  }
  // Every staged value must be within the limit (NaN fails): see FftConvGpu.
  const T limit = src ? InputLimit<T>(a, check->filter_max_bits) : T(0);
  bool safe = true;
  if (a.uw == 1) {  // no division per element
    for (int64_t c = seg.begin + lane; c < seg.end; c += kLanes) {
      const int64_t vc = vc0 + c;
      const bool live = c < need_w && vc >= 0 && vc < a.vw;
      const T v = live ? ToCompute(src[vc * a.iv.w]) : T(0);
      dst[c] = v;
      safe &= !live || (v <= limit && -v <= limit);
    }
  } else {
    for (int64_t c = seg.begin + lane; c < seg.end; c += kLanes) {
      const int64_t vc = vc0 + c;
      const bool live = c < need_w && vc >= 0 && vc < a.vw && vc % a.uw == 0;
      const T v = live ? ToCompute(src[(vc / a.uw) * a.iv.w]) : T(0);
      dst[c] = v;
      safe &= !live || (v <= limit && -v <= limit);
    }
  }
  if (!safe) check->unsafe = 1;  // every writer stores the same value
}

template <typename S, typename T>
__global__ void PadInputKernel(FftArgs a, const S* in, int64_t item0, int64_t n_items,
                               int64_t ci0, int64_t nci, T* real, StagingCheck* check) {
  auto body = [&](int64_t row, Segment seg, int lane) {
    PadInputRow(a, in, item0, n_items, ci0, nci, real, check, row, seg, lane);
  };
  TFBIGCONV_WARP_ROWS(a.chunk * a.groups * a.ci_block * a.fft_d * a.fft_h, a.fft_w, kSegmentCols,
                      body);
}

// y[slot][co][bin] (+)= sum over ci < nci of x[slot][grp(co)][ci][bin] *
// conj(w[co][ci][bin]): correlation is convolution with the conjugate. One
// item per (slot, block of co_per_thread channels, bin), consecutive threads
// on consecutive bins, ci in order. Few channels share a thread (which
// re-reads its x from L1 rather than each channel's thread from L2); many
// channels get a thread each, for parallelism.
template <typename T, typename C>
TFBIGCONV_HD void MixItem(const FftArgs& a, const C* x, const C* w, C* y, int64_t nci,
                          int64_t co_per_thread, bool accumulate, int64_t i) {
  const int64_t co_blocks = (a.cout + co_per_thread - 1) / co_per_thread;
  const int64_t bin = i % a.bins, t = i / a.bins;
  const int64_t co0 = (t % co_blocks) * co_per_thread, slot = t / co_blocks;
  const int64_t co_end = Min64(a.cout, co0 + co_per_thread);
  int64_t grp = co0 / a.cog, k = co0 % a.cog;
  for (int64_t co = co0; co < co_end; ++co) {
    const C* xs = x + ((slot * a.groups + grp) * a.ci_block) * a.bins + bin;
    const C* ws = w + (co * a.ci_block) * a.bins + bin;
    C* yv = y + (slot * a.cout + co) * a.bins + bin;
    T re = T(0), im = T(0);
    if (accumulate) {
      re = yv->x;
      im = yv->y;
    }
    for (int64_t ci = 0; ci < nci; ++ci) {
      const C xv = xs[ci * a.bins], wv = ws[ci * a.bins];
      re += xv.x * wv.x + xv.y * wv.y;
      im += xv.y * wv.x - xv.x * wv.y;
    }
    yv->x = re;
    yv->y = im;
    if (++k == a.cog) {
      k = 0;
      ++grp;
    }
  }
}

template <typename T>
__global__ void MixKernel(FftArgs a, const typename Complex<T>::type* x,
                          const typename Complex<T>::type* w, typename Complex<T>::type* y,
                          int64_t items, int64_t nci, int64_t co_per_thread, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * blockDim.x)
    MixItem<T>(a, x, w, y, nci, co_per_thread, accumulate, i);
}

// out[tile planes/rows/cols] = real[slot][co] sampled by the stride, scaled
// by 1 / (the transform's points) (cuFFT's inverse is unnormalised),
// converted to the storage type. One warp per (slot, tile plane, tile row,
// block of kCropChannels output channels) and segment of the row; each lane
// writes the block's channels of its pixel (contiguous in NHWC).
TFBIGCONV_HD int64_t CropChannelBlocks(const FftArgs& a) {
  return (a.cout + kCropChannels - 1) / kCropChannels;
}

template <typename S, typename T>
TFBIGCONV_HD void CropRow(const FftArgs& a, const T* real, int64_t item0, T scale, S* out,
                          int64_t row, Segment seg, int lane) {
  const int64_t co_blocks = CropChannelBlocks(a);
  const int64_t co_begin = (row % co_blocks) * kCropChannels;
  const int64_t co_end = Min64(a.cout, co_begin + kCropChannels);
  row /= co_blocks;
  const int64_t r = row % a.tile_h, t = row / a.tile_h;
  const int64_t z = t % a.tile_d, slot = t / a.tile_d;
  const int64_t plane = a.fft_h * a.fft_w, volume = a.fft_d * plane;
  const Tile tl = TileOf(a, item0 + slot);
  if (z >= tl.vd || r >= tl.vh) return;
  const T* src = real + slot * a.cout * volume + z * a.sd * plane + r * a.sh * a.fft_w;
  S* dst = out + tl.n * a.ov.n + (tl.od0 + z) * a.ov.d + (tl.oh0 + r) * a.ov.h + tl.ow0 * a.ov.w;
  const int64_t c_end = Min64(seg.end, tl.vw);
  for (int64_t c = seg.begin + lane; c < c_end; c += kLanes) {
    for (int64_t co = co_begin; co < co_end; ++co)
      dst[c * a.ov.w + (co / a.cog) * a.ov.g + (co % a.cog) * a.ov.c] =
          FromCompute<S, T>(src[co * volume + c * a.sw] * scale);
  }
}

template <typename S, typename T>
__global__ void CropKernel(FftArgs a, const T* real, int64_t item0, int64_t n_items, T scale,
                           S* out) {
  auto body = [&](int64_t row, Segment seg, int lane) {
    CropRow(a, real, item0, scale, out, row, seg, lane);
  };
  TFBIGCONV_WARP_ROWS(n_items * a.tile_d * a.tile_h * CropChannelBlocks(a), a.tile_w,
                      kCropSegmentCols, body);
}

// The steps of one call: on the GPU (kernels and cuFFT on a stream) or, for
// tests, on the CPU (the kernels' bodies in a loop, transforms by `fft`).
struct Steps {
  cudaStream_t stream = nullptr;
  const HostFft* host_fft = nullptr;  // set: run on the CPU
  const CufftApi* api = nullptr;
  void* work = nullptr;
  bool dbl = false;

  bool on_host() const { return host_fft != nullptr; }
  std::string Fft(int64_t d, int64_t h, int64_t w, int64_t batch, bool forward, void* in,
                  void* out) const {
    if (on_host()) return (*host_fft)(d, h, w, batch, forward, in, out);
    return Exec(*api, stream, d, h, w, batch, forward, dbl, in, out, work);
  }
  // Zeroes `bytes` of the workspace at `dst` (stream-ordered on the GPU).
  std::string Zero(void* dst, size_t bytes) const {
    if (on_host()) {
      memset(dst, 0, bytes);
      return "";
    }
    const cudaError_t e = cudaMemsetAsync(dst, 0, bytes, stream);
    return e == cudaSuccess ? "" : std::string("cudaMemsetAsync: ") + cudaGetErrorString(e);
  }
  // Copies `bytes` from the workspace to the host once the stream's work is done.
  std::string Read(void* dst, const void* src, size_t bytes) const {
    if (on_host()) {
      memcpy(dst, src, bytes);
      return "";
    }
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    return e == cudaSuccess ? "" : std::string("reading the staging check: ") + cudaGetErrorString(e);
  }
  template <typename Body>
  std::string WarpRows(int64_t rows, int64_t width, int64_t seg_cols, Body body) const {
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t c0 = 0; c0 < width; c0 += seg_cols)
        for (int lane = 0; lane < kLanes; ++lane)
          body(row, Segment{c0, std::min(width, c0 + seg_cols)}, lane);
    return "";
  }
};

template <typename S>
std::string Run(const FftGpuParams& p, Steps steps) {
  using T = typename ComputeOf<S>::type;
  using C = typename Complex<T>::type;
  const ConvGeometry& g = p.problem.g;
  const FftGpuPlan& pl = p.plan;
  FftArgs a;
  FillGeometryArgs(p.problem, &a);
  a.tile_h = pl.tile_h;
  a.tile_w = pl.tile_w;
  a.tiles_h = pl.tiles_h;
  a.tiles_w = pl.tiles_w;
  a.fft_h = pl.fft_h;
  a.fft_w = pl.fft_w;
  a.tile_d = pl.tile_d;
  a.tiles_d = pl.tiles_d;
  a.fft_d = pl.fft_d;
  a.bins = pl.bins();
  a.ci_block = pl.ci_block;
  a.chunk = pl.chunk;

  char* ws = static_cast<char*>(p.workspace);
  C* wspec = reinterpret_cast<C*>(ws + pl.wspec_offset());
  C* xspec = reinterpret_cast<C*>(ws + pl.xspec_offset());
  C* yspec = reinterpret_cast<C*>(ws + pl.yspec_offset());
  T* real = reinterpret_cast<T*>(ws + pl.real_offset());
  steps.work = ws + pl.work_offset();
  StagingCheck* check = reinterpret_cast<StagingCheck*>(ws + pl.check_offset());
  steps.dbl = p.dtype == DType::kDouble;
  const cudaStream_t stream = steps.stream;
  std::string err = steps.Zero(check, sizeof(StagingCheck));
  if (!err.empty()) return err;
  S* out = static_cast<S*>(p.output);
  const FftGpuBatches b = BatchesOf(g, pl);
  const int64_t volume = pl.fft_d * pl.fft_h * pl.fft_w;
  const int64_t blocks = CeilDiv(a.cig, pl.ci_block);
  const S* in = static_cast<const S*>(p.input);
  const S* filt = static_cast<const S*>(p.filter);
  for (int64_t c0 = 0; c0 < pl.items; c0 += pl.chunk) {
    const int64_t n = std::min(pl.chunk, pl.items - c0);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t ci0 = blk * pl.ci_block, nci = std::min(pl.ci_block, a.cig - ci0);
      if (blocks > 1 || c0 == 0) {  // one block's filter spectra serve every chunk
        const int64_t rows = b.filter * pl.fft_d * pl.fft_h;
        if (!(err = steps.Zero(&check->filter_max_bits, sizeof(check->filter_max_bits))).empty())
          return err;
        if (steps.on_host()) {
          steps.WarpRows(rows, pl.fft_w, kSegmentCols, [&](int64_t row, Segment seg, int lane) {
            PadFilterRow(a, filt, ci0, nci, real, check, row, seg, lane);
          });
        } else {
          PadFilterKernel<S, T><<<GridForRows(rows, pl.fft_w, kSegmentCols), kThreads, 0,
                                  stream>>>(a, filt, ci0, nci, real, check);
          if (!(err = LaunchError("FFT filter padding")).empty()) return err;
        }
        err = steps.Fft(pl.fft_d, pl.fft_h, pl.fft_w, b.filter, true, real, wspec);
        if (!err.empty()) return err;
      }
      const int64_t rows = b.input * pl.fft_d * pl.fft_h;
      if (steps.on_host()) {
        steps.WarpRows(rows, pl.fft_w, kSegmentCols, [&](int64_t row, Segment seg, int lane) {
          PadInputRow(a, in, c0, n, ci0, nci, real, check, row, seg, lane);
        });
      } else {
        PadInputKernel<S, T><<<GridForRows(rows, pl.fft_w, kSegmentCols), kThreads, 0, stream>>>(
            a, in, c0, n, ci0, nci, real, check);
        if (!(err = LaunchError("FFT input padding")).empty()) return err;
      }
      err = steps.Fft(pl.fft_d, pl.fft_h, pl.fft_w, b.input, true, real, xspec);
      if (!err.empty()) return err;
      const int64_t co_per_thread = a.cout * nci <= kMixMacsPerThread ? a.cout : 1;
      const int64_t items = n * CeilDiv(a.cout, co_per_thread) * a.bins;
      if (steps.on_host()) {
        for (int64_t i = 0; i < items; ++i)
          MixItem<T>(a, xspec, wspec, yspec, nci, co_per_thread, blk > 0, i);
      } else {
        MixKernel<T><<<GridFor(items, kThreads), kThreads, 0, stream>>>(
            a, xspec, wspec, yspec, items, nci, co_per_thread, blk > 0);
        if (!(err = LaunchError("FFT channel mixing")).empty()) return err;
      }
    }
    err = steps.Fft(pl.fft_d, pl.fft_h, pl.fft_w, b.output, false, yspec, real);
    if (!err.empty()) return err;
    const int64_t rows = n * pl.tile_d * pl.tile_h * CropChannelBlocks(a);
    const T scale = T(1) / T(volume);
    if (steps.on_host()) {
      steps.WarpRows(rows, pl.tile_w, kCropSegmentCols, [&](int64_t row, Segment seg, int lane) {
        CropRow(a, real, c0, scale, out, row, seg, lane);
      });
    } else {
      CropKernel<S, T><<<GridForRows(rows, pl.tile_w, kCropSegmentCols), kThreads, 0, stream>>>(
          a, real, c0, n, scale, out);
      if (!(err = LaunchError("FFT output crop")).empty()) return err;
    }
  }
  // A window failed the staging check: the direct kernel recomputes the call
  // (no workspace: its plan without partial sums).
  unsigned int unsafe = 0;
  if (!(err = steps.Read(&unsafe, &check->unsafe, sizeof(unsafe))).empty()) return err;
  if (!unsafe) return "";
  DirectGpuParams d{p, PlanDirectGpu(p.problem, p.dtype, 0)};
  d.workspace = nullptr;
  if (steps.on_host()) {
    d.plan.tiled = false;  // the emulated kernel; the same sums
    return DirectConvOnHost(d);
  }
  return DirectConvGpu(d, stream);
}

// ---- planning ----------------------------------------------------------

// Workspace of a plan whose tile, chunk and ci_block are set, with cuFFT's
// work area taken as `work_bytes` (the layout: csrc/core/fft_gpu_layout.h).
void FillBytes(const ConvGeometry& g, DType dtype, int64_t work_bytes, FftGpuPlan* p) {
  static_cast<FftGpuLayout&>(*p) = FftGpuWorkspaceLayout(g, dtype, p->fft_d, p->fft_h, p->fft_w,
                                                         p->chunk, p->ci_block, work_bytes);
}

// cuFFT's work area is about one complex copy of the largest batch; the
// exact size comes from the plans once the shape is chosen.
int64_t WorkEstimate(const ConvGeometry& g, DType dtype, const FftGpuPlan& p) {
  const FftGpuBatches b = BatchesOf(g, p);
  return SatMul(std::max({b.filter, b.input, b.output}),
                FftGpuSpectrumBytes(p.fft_d, p.fft_h, p.fft_w, dtype));
}

double Seconds(const ConvGeometry& g, DType dtype, const FftGpuPlan& p) {
  const double plane = double(p.fft_d * p.fft_h * p.fft_w), rb = double(ComputeBytes(dtype));
  const double flops = 0.5 * ComplexFftFlops(int64_t(plane));  // a real transform
  const double blocks = double(CeilDiv(g.in_c_per_group(), p.ci_block));
  const double filter_tf = double(g.out_c * g.in_c_per_group()) * (blocks > 1 ? double(CeilDiv(p.items, p.chunk)) : 1.0);
  const double tf = double(p.items) * double(g.in_c + g.out_c) + filter_tf;
  const double mix_bytes =
      double(p.items) * double(g.out_c) * double(g.in_c_per_group() + 1) * double(p.bins()) * 4 * rb;
  return tf * flops / kFftFlopsPerSecond + (tf * plane * rb * 4 + mix_bytes) / kBytesPerSecond;
}

}  // namespace

bool CufftAvailable(std::string* why) { return Cufft(why) != nullptr; }

std::string PlanFftGpu(const ConvGeometry& g, DType dtype, int64_t limit, cudaStream_t stream,
                       FftGpuPlan* out) {
  std::string why;
  const CufftApi* api = Cufft(&why);
  if (!api) return "GPU fft unavailable: " + why;
  const int64_t cig = std::max<int64_t>(1, g.in_c_per_group());
  const std::vector<TileCandidate> ds =
      TileCandidates(std::max<int64_t>(g.out[kD], 1), g.stride[kD], g.effective_filter(kD),
                     g.pad_before[kD], g.virtual_in(kD));
  const std::vector<TileCandidate> hs =
      TileCandidates(std::max<int64_t>(g.out[kH], 1), g.stride[kH], g.effective_filter(kH),
                     g.pad_before[kH], g.virtual_in(kH));
  const std::vector<TileCandidate> ws =
      TileCandidates(std::max<int64_t>(g.out[kW], 1), g.stride[kW], g.effective_filter(kW),
                     g.pad_before[kW], g.virtual_in(kW));
  FftGpuPlan best;
  bool found = false;
  int64_t min_needed = INT64_MAX;
  for (const TileCandidate& d : ds) {
    for (const TileCandidate& h : hs) {
      for (const TileCandidate& w : ws) {
        FftGpuPlan p;
        p.tile_d = d.tile;
        p.fft_d = d.fft;
        p.tiles_d = CeilDiv(std::max<int64_t>(g.out[kD], 1), p.tile_d);
        p.tile_h = h.tile;
        p.fft_h = h.fft;
        p.tile_w = w.tile;
        p.fft_w = w.fft;
        p.tiles_h = CeilDiv(std::max<int64_t>(g.out[kH], 1), p.tile_h);
        p.tiles_w = CeilDiv(std::max<int64_t>(g.out[kW], 1), p.tile_w);
        p.items = std::max<int64_t>(1, g.batch * p.tiles_d * p.tiles_h * p.tiles_w);
        // Largest ci_block (halving) and then chunk (doubling) that fit.
        p.chunk = 1;
        for (p.ci_block = cig;; p.ci_block = CeilDiv(p.ci_block, 2)) {
          FillBytes(g, dtype, WorkEstimate(g, dtype, p), &p);
          if (p.workspace_bytes <= limit || p.ci_block == 1) break;
        }
        if (p.workspace_bytes > limit) {
          min_needed = std::min(min_needed, p.workspace_bytes);
          continue;
        }
        while (p.chunk < p.items) {
          FftGpuPlan q = p;
          q.chunk = std::min(p.items, 2 * p.chunk);
          FillBytes(g, dtype, WorkEstimate(g, dtype, q), &q);
          if (q.workspace_bytes > limit || q.xspec_bytes + q.yspec_bytes > kChunkTargetBytes) break;
          p = q;
        }
        p.seconds = Seconds(g, dtype, p);
        if (!found || p.seconds < best.seconds) best = p;
        found = true;
      }
    }
  }
  if (!found)
    return "no GPU FFT plan fits workspace_limit_bytes=" + std::to_string(limit) +
           "; the smallest needs " + std::to_string(min_needed) + " bytes";
  // The exact cuFFT work areas; halve the chunk while they push it over.
  std::string err = ActivateStreamDevice(stream);
  if (!err.empty()) return err;
  const bool dbl = dtype == DType::kDouble;
  for (;;) {
    const FftGpuBatches b = BatchesOf(g, best);
    size_t work = 0;
    {
      std::lock_guard<std::mutex> lock(PlanMutex());
      const std::pair<int64_t, int> jobs[] = {{b.filter, dbl ? CUFFT_D2Z : CUFFT_R2C},
                                              {b.input, dbl ? CUFFT_D2Z : CUFFT_R2C},
                                              {b.output, dbl ? CUFFT_Z2D : CUFFT_C2R}};
      for (const auto& j : jobs) {
        CachedPlan cp;
        err = GetPlan(*api, stream, best.fft_d, best.fft_h, best.fft_w, j.first, j.second, &cp);
        if (!err.empty()) return err;
        work = std::max(work, cp.work_bytes);
      }
    }
    FillBytes(g, dtype, int64_t(work), &best);
    if (best.workspace_bytes <= limit) break;
    if (best.chunk == 1)
      return "no GPU FFT plan fits workspace_limit_bytes=" + std::to_string(limit) +
             "; the smallest needs " + std::to_string(best.workspace_bytes) + " bytes";
    best.chunk = CeilDiv(best.chunk, 2);
  }
  best.seconds = Seconds(g, dtype, best);
  *out = best;
  return "";
}

namespace {
std::string RunDType(const FftGpuParams& p, const Steps& steps) {
  switch (p.dtype) {
    case DType::kFloat: return Run<float>(p, steps);
    case DType::kDouble: return Run<double>(p, steps);
    case DType::kHalf: return Run<__half>(p, steps);
    case DType::kBFloat16: return Run<__nv_bfloat16>(p, steps);
  }
  return "FFT convolution: unknown dtype";
}
}  // namespace

std::string FftConvGpu(const FftGpuParams& p, cudaStream_t stream) {
  if (p.problem.g.output_elements() == 0) return "";
  std::string why;
  const CufftApi* api = Cufft(&why);
  if (!api) return "GPU fft unavailable: " + why;
  std::string err = ActivateStreamDevice(stream);
  if (!err.empty()) return err;
  const ConvGeometry& g = p.problem.g;
  if (g.in_c_per_group() == 0) {  // an empty sum (dL/dfilter of an empty batch)
    // Every problem's output view covers its whole dense tensor; 0 bits are 0.0.
    const cudaError_t e = cudaMemsetAsync(p.output, 0, g.output_elements() * StorageBytes(p.dtype), stream);
    return e == cudaSuccess ? "" : std::string("zeroing the output: ") + cudaGetErrorString(e);
  }
  Steps steps;
  steps.stream = stream;
  steps.api = api;
  return RunDType(p, steps);
}

std::string FftConvOnHost(const FftGpuParams& p, const HostFft& fft) {
  if (p.problem.g.output_elements() == 0) return "";
  if (p.problem.g.in_c_per_group() == 0) return "FFT convolution on the host: empty sum";
  Steps steps;
  steps.host_fft = &fft;
  return RunDType(p, steps);
}

}  // namespace gpu
}  // namespace tfbigconv
