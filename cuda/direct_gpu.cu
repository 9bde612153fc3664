#include "direct_gpu.h"

#include <algorithm>

#include "gpu_common.cuh"

namespace tfbigconv {
namespace gpu {
namespace {

// Thread block: kBX x kBY threads; each thread computes kRows x kCols output
// pixels (kBY and kBX apart, so neighbouring threads read neighbouring shared
// memory words) for channels_per_thread output channels.
constexpr int kBX = 32, kBY = 8, kThreads = kBX * kBY;
constexpr int kRows = 4, kCols = 2;
constexpr int64_t kTileH = kBY * kRows, kTileW = kBX * kCols;  // 32 x 64 outputs
// Static shared memory limit without opt-in, on every architecture we build.
constexpr int64_t kSharedBytes = 48 << 10;
// Largest filter sub-block side: bigger ones gain little once the halo is a
// fraction of the tile.
constexpr int kMaxSubBlock = 32;
// Blocks the split reduction aims for: enough to fill an H100 several times.
// A constant (not the SM count), so that results do not depend on the device.
constexpr int64_t kTargetBlocks = 2048;
constexpr int64_t kMaxSplits = 64;
// The reduction kernel: threads it aims for (a constant, not the SM count, so
// that the split, and with it the rounding, does not depend on the device),
// the fewest multiply-add steps per thread and split worth a partial sum, and
// the largest output it takes (bigger outputs have parallelism enough).
constexpr int kRedThreads = 256;
constexpr int64_t kRedTargetThreads = int64_t(1) << 19;
constexpr int64_t kRedMinSteps = 64;
constexpr int64_t kRedMaxOutW = 16, kRedMaxOutPixels = 1024, kRedMinReduction = 256;
// Uncalibrated throughput guesses for the auto choice (multiply-adds/s).
constexpr double kTiledMacsPerSecond = 8e12, kUntiledMacsPerSecond = 1e12;
// The depthwise kernel: output columns per thread, threads per block, and the
// fewest groups (channels) for which lanes along channels fill a warp's loads.
constexpr int kDepthwiseCols = 4, kDepthwiseThreads = 256;
constexpr int64_t kDepthwiseMinGroups = 8;
// ... and at most this many filter taps: beyond 5x5 the tiled and reduction
// kernels were faster on an H100 (2026-11-26 grid: 7x7 even, 13x13 2.5x,
// 31x31 3.7x; every dL/dfilter, whose "filter" is dy, 2-10x).
constexpr int64_t kDepthwiseMaxTaps = 25;

// Everything the kernels read, precomputed on the host: the geometry
// (GeometryArgs, gpu_common.cuh) and the plan's blocking.
//
// Depth (3-D): every kernel runs each (image n, output depth od) pair as one
// image, img = n * out_d + od, and the filter's depth taps kd are reduction
// rows like its rows kh; a tap whose input plane is padding (or between
// in_dilation's samples) is skipped whole (InputPlane). In 2-D out_d and
// filter_d are 1, so img = n and kd = 0.
struct DirectArgs : GeometryArgs {
  const void* in;
  const void* filt;
  void* out;
  void* partial;  // splits x output elements (dense img, group, co, oh, ow), or null
  int64_t images;  // batch x out_d
  int64_t tiles_h, tiles_w, co_blocks;
  // Tiled and untiled kernels: input-channel splits, and splits of the
  // (kd, block of kb_h filter rows) units, kh_units blocks per depth tap.
  int64_t ci_splits, ci_per, kh_splits, kh_per, kh_units;
  int64_t kb_h, kb_w, patch_max;  // sub-block and its largest patch (elements)
  int64_t out_elems, total;       // total: blocks (tiled) or outputs x splits (untiled)
  // The reduction kernel: columns (img, group, channel block), column pieces
  // of out_w, reduction rows (ci, kd, kh) and their split.
  int64_t red_cols, red_pieces, red_rows, red_rows_per;
  // The depthwise kernel: channels per thread (its vector width; 0 where the
  // views do not allow it), channel vectors per pixel and column pieces.
  int64_t dw_vec, dw_vectors, dw_pieces;
};

// Virtual input sample (vr, vc) of channel ci of an input plane as T: zero
// in the padding and between the samples that in_dilation spreads apart.
template <typename S, typename T>
TFBIGCONV_HD T InputAt(const DirectArgs& a, const S* in_plane, int64_t ci, int64_t vr,
                       int64_t vc) {
  if (vr < 0 || vr >= a.vh || vc < 0 || vc >= a.vw || vr % a.uh != 0 || vc % a.uw != 0)
    return T(0);
  return ToCompute(in_plane[ci * a.iv.c + (vr / a.uh) * a.iv.h + (vc / a.uw) * a.iv.w]);
}

template <typename S>
TFBIGCONV_HD const S* FilterAt(const DirectArgs& a, int64_t kd, int64_t kh, int64_t kw,
                               int64_t ci, int64_t grp, int64_t co) {
  return static_cast<const S*>(a.filt) + a.fv.offset + kd * a.fv.d + kh * a.fv.h + kw * a.fv.w +
         ci * a.fv.i + grp * a.fv.g + co * a.fv.o;
}

// Offset of image img's output in the output tensor.
TFBIGCONV_HD int64_t OutImage(const DirectArgs& a, int64_t img) {
  return (img / a.out_d) * a.ov.n + (img % a.out_d) * a.ov.d;
}

// out_img: OutImage(a, img).
template <typename S, typename T>
TFBIGCONV_HD void WriteOut(const DirectArgs& a, int64_t split, int64_t img, int64_t out_img,
                           int64_t grp, int64_t co, int64_t oh, int64_t ow, T v) {
  if (a.partial) {
    const int64_t dense = (((img * a.groups + grp) * a.cog + co) * a.out_h + oh) * a.out_w + ow;
    static_cast<T*>(a.partial)[split * a.out_elems + dense] = v;
  } else {
    static_cast<S*>(a.out)[out_img + oh * a.ov.h + ow * a.ov.w + grp * a.ov.g + co * a.ov.c] =
        FromCompute<S, T>(v);
  }
}

// A run of reduction rows that share their (outer index, depth tap kd): rows
// r of [*r, end) are (outer, kd, inner) with `inner` values fastest; the run
// has inner values [begin, end). Advances *r past it. Runs keep divisions
// out of the per-row loops.
struct RowRun {
  int64_t outer, kd, begin, end;
};
TFBIGCONV_HD RowRun NextRun(int64_t* r, int64_t end, int64_t inner, int64_t filter_d) {
  const int64_t q = *r / inner, b = *r % inner;
  const int64_t e = Min64(inner, b + (end - *r));
  *r += e - b;
  return {q / filter_d, q % filter_d, b, e};
}

// Block index -> (image, group, split, channel block, tile), tiles fastest.
struct BlockPos {
  int64_t img, grp, sc, sk, cb, th, tw;
};
__device__ __forceinline__ BlockPos Decompose(const DirectArgs& a, int64_t b) {
  BlockPos p;
  p.tw = b % a.tiles_w; b /= a.tiles_w;
  p.th = b % a.tiles_h; b /= a.tiles_h;
  p.cb = b % a.co_blocks; b /= a.co_blocks;
  p.sk = b % a.kh_splits; b /= a.kh_splits;
  p.sc = b % a.ci_splits; b /= a.ci_splits;
  p.grp = b % a.groups;
  p.img = b / a.groups;
  return p;
}

template <typename S, typename T, int CPT>
__global__ void __launch_bounds__(kThreads) DirectTiledKernel(DirectArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_in = reinterpret_cast<T*>(smem);
  T* s_f = s_in + a.patch_max;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kBX + tx;
  for (int64_t b = blockIdx.x; b < a.total; b += gridDim.x) {
    const BlockPos p = Decompose(a, b);
    const int64_t oh0 = p.th * kTileH, ow0 = p.tw * kTileW, co0 = p.cb * CPT;
    const int64_t od = p.img % a.out_d;
    const int64_t ci_end = min(a.cig, (p.sc + 1) * a.ci_per);
    const int64_t u_end = min(a.filter_d * a.kh_units, (p.sk + 1) * a.kh_per);
    const S* in_ng =
        static_cast<const S*>(a.in) + (p.img / a.out_d) * a.iv.n + p.grp * a.iv.g;
    T acc[kRows][kCols][CPT];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int q = 0; q < kCols; ++q)
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[r][q][c] = T(0);
    for (int64_t ci = p.sc * a.ci_per; ci < ci_end; ++ci) {
      for (int64_t u = p.sk * a.kh_per; u < u_end;) {
        // The block's threads skip the same depth taps: the barriers stay uniform.
        const RowRun run = NextRun(&u, u_end, a.kh_units, a.filter_d);
        const int64_t plane = InputPlane(a, od, run.kd);
        if (plane < 0) continue;
        const S* in_plane = in_ng + plane;
        const int64_t kh_stop = min(a.filter_h, run.end * a.kb_h);
        for (int64_t kh0 = run.begin * a.kb_h; kh0 < kh_stop; kh0 += a.kb_h) {
          const int nkh = int(min(a.kb_h, kh_stop - kh0));
          for (int64_t kw0 = 0; kw0 < a.filter_w; kw0 += a.kb_w) {
            const int nkw = int(min(a.kb_w, a.filter_w - kw0));
            // Patch of virtual input feeding the tile through this sub-block.
            const int pr = int((kTileH - 1) * a.sh + (nkh - 1) * a.dh + 1);
            const int pc = int((kTileW - 1) * a.sw + (nkw - 1) * a.dw + 1);
            const int64_t vr0 = oh0 * a.sh - a.pt + kh0 * a.dh;
            const int64_t vc0 = ow0 * a.sw - a.pl + kw0 * a.dw;
            __syncthreads();  // the previous sub-block is no longer read
            for (int i = tid; i < pr * pc; i += kThreads)
              s_in[i] = InputAt<S, T>(a, in_plane, ci, vr0 + i / pc, vc0 + i % pc);
            for (int i = tid; i < nkh * nkw * CPT; i += kThreads) {
              const int c = i % CPT, t = i / CPT;
              const int64_t co = co0 + c;
              s_f[i] = co < a.cog ? ToCompute(*FilterAt<S>(a, run.kd, kh0 + t / nkw,
                                                           kw0 + t % nkw, ci, p.grp, co))
                                  : T(0);
            }
            __syncthreads();
            const int row_step = int(kBY * a.sh) * pc, col_step = int(kBX * a.sw);
            const T* s_thread = s_in + int(ty * a.sh) * pc + int(tx * a.sw);
            for (int kh = 0; kh < nkh; ++kh) {
              for (int kw = 0; kw < nkw; ++kw) {
                T f[CPT];
#pragma unroll
                for (int c = 0; c < CPT; ++c) f[c] = s_f[(kh * nkw + kw) * CPT + c];
                const T* s = s_thread + int(kh * a.dh) * pc + int(kw * a.dw);
#pragma unroll
                for (int r = 0; r < kRows; ++r)
#pragma unroll
                  for (int q = 0; q < kCols; ++q) {
                    const T x = s[r * row_step + q * col_step];
#pragma unroll
                    for (int c = 0; c < CPT; ++c) acc[r][q][c] += x * f[c];
                  }
              }
            }
          }
        }
      }
    }
    const int64_t split = p.sc * a.kh_splits + p.sk, out_img = OutImage(a, p.img);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int q = 0; q < kCols; ++q) {
        const int64_t oh = oh0 + ty + r * kBY, ow = ow0 + tx + q * kBX;
        if (oh >= a.out_h || ow >= a.out_w) continue;
#pragma unroll
        for (int c = 0; c < CPT; ++c)
          if (co0 + c < a.cog)
            WriteOut<S, T>(a, split, p.img, out_img, p.grp, co0 + c, oh, ow, acc[r][q][c]);
      }
  }
}

// One thread per (split, output element); for geometries whose tile does not
// fit in shared memory. Reads go through the caches.
template <typename S, typename T>
TFBIGCONV_HD void DirectUntiledItem(const DirectArgs& a, int64_t i) {
  int64_t e = i % a.out_elems;
  const int64_t split = i / a.out_elems;
  const int64_t ow = e % a.out_w; e /= a.out_w;
  const int64_t oh = e % a.out_h; e /= a.out_h;
  const int64_t co = e % a.cog; e /= a.cog;
  const int64_t grp = e % a.groups;
  const int64_t img = e / a.groups, od = img % a.out_d;
  const int64_t sc = split / a.kh_splits, sk = split % a.kh_splits;
  const S* in_ng = static_cast<const S*>(a.in) + (img / a.out_d) * a.iv.n + grp * a.iv.g;
  const int64_t ci_end = Min64(a.cig, (sc + 1) * a.ci_per);
  const int64_t u_end = Min64(a.filter_d * a.kh_units, (sk + 1) * a.kh_per);
  T acc = T(0);
  for (int64_t ci = sc * a.ci_per; ci < ci_end; ++ci)
    for (int64_t u = sk * a.kh_per; u < u_end;) {
      const RowRun run = NextRun(&u, u_end, a.kh_units, a.filter_d);
      const int64_t plane = InputPlane(a, od, run.kd);
      if (plane < 0) continue;
      // Units of kb_h rows as in the tiled kernel (1 in untiled plans; the
      // FFT's fallback on the host runs a tiled plan here).
      const int64_t kh_stop = Min64(a.filter_h, run.end * a.kb_h);
      for (int64_t kh = run.begin * a.kb_h; kh < kh_stop; ++kh) {
        const int64_t vr = oh * a.sh - a.pt + kh * a.dh;
        for (int64_t kw = 0; kw < a.filter_w; ++kw) {
          const T x = InputAt<S, T>(a, in_ng + plane, ci, vr, ow * a.sw - a.pl + kw * a.dw);
          acc += x * ToCompute(*FilterAt<S>(a, run.kd, kh, kw, ci, grp, co));
        }
      }
    }
  WriteOut<S, T>(a, split, img, OutImage(a, img), grp, co, oh, ow, acc);
}

template <typename S, typename T>
__global__ void DirectUntiledKernel(DirectArgs a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.total;
       i += int64_t(gridDim.x) * blockDim.x)
    DirectUntiledItem<S, T>(a, i);
}

// VC neighbouring storage elements, loaded or stored as one vector.
template <typename S, int VC>
struct alignas(sizeof(S) * VC) StorageVec {
  S v[VC];
};

// The depthwise kernel. Thread -> (split, img, oh, column piece, channel
// vector), the channel vector fastest, so that a warp's lanes load
// neighbouring vectors. Each thread sums its split's reduction rows (ci, kd,
// kh) x all kw for VC channels x kDepthwiseCols output columns. Partial sums
// go to partial[split][oh][ow][img, group] (the reduction kernel's layout);
// without splits the thread writes the output. The caller checked that the
// groups are innermost with unit stride in every view and that every vector
// is aligned.
template <typename S, typename T, int VC>
TFBIGCONV_HD void DirectDepthwiseItem(const DirectArgs& a, int64_t t) {
  constexpr int TW = kDepthwiseCols;
  const int64_t grp0 = (t % a.dw_vectors) * VC;
  int64_t rest = t / a.dw_vectors;
  const int64_t ow0 = (rest % a.dw_pieces) * TW;
  rest /= a.dw_pieces;
  const int64_t oh = rest % a.out_h;
  rest /= a.out_h;
  const int64_t img = rest % a.images, split = rest / a.images;
  T acc[TW][VC];
#pragma unroll
  for (int q = 0; q < TW; ++q)
#pragma unroll
    for (int c = 0; c < VC; ++c) acc[q][c] = T(0);
  const S* in_n = static_cast<const S*>(a.in) + (img / a.out_d) * a.iv.n + grp0;
  const S* f_g = static_cast<const S*>(a.filt) + a.fv.offset + grp0;
  const int64_t row_end = Min64(a.red_rows, (split + 1) * a.red_rows_per);
  for (int64_t row = split * a.red_rows_per; row < row_end;) {
    const RowRun run = NextRun(&row, row_end, a.filter_h, a.filter_d);
    const int64_t plane = InputPlane(a, img % a.out_d, run.kd);
    if (plane < 0) continue;
    const S* x_ci = in_n + run.outer * a.iv.c + plane;
    const S* f_ci = f_g + run.outer * a.fv.i + run.kd * a.fv.d;
    for (int64_t kh = run.begin; kh < run.end; ++kh) {
      const int64_t vr = oh * a.sh - a.pt + kh * a.dh;
      if (vr < 0 || vr >= a.vh || vr % a.uh != 0) continue;
      const S* x_row = x_ci + (vr / a.uh) * a.iv.h;
      const S* f_row = f_ci + kh * a.fv.h;
      for (int64_t kw = 0; kw < a.filter_w; ++kw) {
        const StorageVec<S, VC> fs =
            *reinterpret_cast<const StorageVec<S, VC>*>(f_row + kw * a.fv.w);
        T f[VC];
#pragma unroll
        for (int c = 0; c < VC; ++c) f[c] = ToCompute(fs.v[c]);
        const int64_t vc0 = ow0 * a.sw - a.pl + kw * a.dw;
#pragma unroll
        for (int q = 0; q < TW; ++q) {
          const int64_t vc = vc0 + q * a.sw;
          if (vc < 0 || vc >= a.vw || vc % a.uw != 0) continue;
          const StorageVec<S, VC> xs =
              *reinterpret_cast<const StorageVec<S, VC>*>(x_row + (vc / a.uw) * a.iv.w);
#pragma unroll
          for (int c = 0; c < VC; ++c) acc[q][c] += ToCompute(xs.v[c]) * f[c];
        }
      }
    }
  }
  const int64_t col_elems = a.images * a.groups;  // (img, group) per pixel; cog is 1
#pragma unroll
  for (int q = 0; q < TW; ++q) {
    const int64_t ow = ow0 + q;
    if (ow >= a.out_w) continue;
    if (a.partial) {
      T* part = static_cast<T*>(a.partial) + ((split * a.out_h + oh) * a.out_w + ow) * col_elems +
                img * a.groups + grp0;
#pragma unroll
      for (int c = 0; c < VC; ++c) part[c] = acc[q][c];
    } else {
      StorageVec<S, VC> ys;
#pragma unroll
      for (int c = 0; c < VC; ++c) ys.v[c] = FromCompute<S, T>(acc[q][c]);
      *reinterpret_cast<StorageVec<S, VC>*>(static_cast<S*>(a.out) + OutImage(a, img) +
                                            oh * a.ov.h + ow * a.ov.w + grp0) = ys;
    }
  }
}

template <typename S, typename T, int VC>
__global__ void __launch_bounds__(kDepthwiseThreads) DirectDepthwiseKernel(DirectArgs a) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < a.total;
       t += int64_t(gridDim.x) * blockDim.x)
    DirectDepthwiseItem<S, T, VC>(a, t);
}

// out = sum of the splits' partial sums, in split order.
template <typename S, typename T>
TFBIGCONV_HD void ReduceSplitsItem(const DirectArgs& a, int64_t splits, int64_t i) {
  const T* part = static_cast<const T*>(a.partial);
  T sum = part[i];
  for (int64_t s = 1; s < splits; ++s) sum += part[s * a.out_elems + i];
  int64_t e = i;
  const int64_t ow = e % a.out_w; e /= a.out_w;
  const int64_t oh = e % a.out_h; e /= a.out_h;
  const int64_t co = e % a.cog; e /= a.cog;
  const int64_t grp = e % a.groups;
  const int64_t img = e / a.groups;
  static_cast<S*>(a.out)[OutImage(a, img) + oh * a.ov.h + ow * a.ov.w + grp * a.ov.g +
                         co * a.ov.c] = FromCompute<S, T>(sum);
}

template <typename S, typename T>
__global__ void ReduceSplitsKernel(DirectArgs a, int64_t splits) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.out_elems;
       i += int64_t(gridDim.x) * blockDim.x)
    ReduceSplitsItem<S, T>(a, splits, i);
}

// The reduction kernel. Thread -> (split, output row oh, column piece, column
// j = (img, group, channel block)), j fastest, so that a warp's lanes read
// neighbouring channels (NHWC) while sharing the loop over the reduction.
// Each thread sums its split's rows (ci, kd, kh) x all kw for CO channels x
// TW output columns. Partial sums go to partial[split][oh][ow][img, group, co]
// (coalesced); without splits the thread writes the output.
template <typename S, typename T, int CO, int TW>
TFBIGCONV_HD void DirectReductionItem(const DirectArgs& a, int64_t t) {
  int64_t j = t % a.red_cols, rest = t / a.red_cols;
  const int64_t piece = rest % a.red_pieces;
  rest /= a.red_pieces;
  const int64_t oh = rest % a.out_h, split = rest / a.out_h;
  const int64_t co0 = (j % a.co_blocks) * CO;
  j /= a.co_blocks;
  const int64_t grp = j % a.groups, img = j / a.groups;
  const int nco = int(Min64(int64_t(CO), a.cog - co0));
  const int64_t ow0 = piece * TW;
  const int nw = int(Min64(int64_t(TW), a.out_w - ow0));
  T acc[CO][TW];
#pragma unroll
  for (int c = 0; c < CO; ++c)
#pragma unroll
    for (int q = 0; q < TW; ++q) acc[c][q] = T(0);
  const S* in_ng = static_cast<const S*>(a.in) + (img / a.out_d) * a.iv.n + grp * a.iv.g;
  const S* f_g = static_cast<const S*>(a.filt) + a.fv.offset + grp * a.fv.g + co0 * a.fv.o;
  const int64_t row_end = Min64(a.red_rows, (split + 1) * a.red_rows_per);
  const int64_t vc0 = ow0 * a.sw - a.pl;
  for (int64_t row = split * a.red_rows_per; row < row_end;) {
    const RowRun run = NextRun(&row, row_end, a.filter_h, a.filter_d);
    const int64_t plane = InputPlane(a, img % a.out_d, run.kd);
    if (plane < 0) continue;
    const S* x_ci = in_ng + run.outer * a.iv.c + plane;
    const S* f_ci = f_g + run.outer * a.fv.i + run.kd * a.fv.d;
    for (int64_t kh = run.begin; kh < run.end; ++kh) {
      const int64_t vr = oh * a.sh - a.pt + kh * a.dh;  // in_dilation_h is 1 here
      if (vr < 0 || vr >= a.vh) continue;
      const S* x_row = x_ci + vr * a.iv.h;
      const S* f_row = f_ci + kh * a.fv.h;
      for (int64_t kw = 0; kw < a.filter_w; ++kw) {
        T f[CO], x[TW];
#pragma unroll
        for (int c = 0; c < CO; ++c)
          f[c] = c < nco ? ToCompute(f_row[kw * a.fv.w + c * a.fv.o]) : T(0);
        const int64_t vc = vc0 + kw * a.dw;
#pragma unroll
        for (int q = 0; q < TW; ++q) {
          const int64_t v = vc + q * a.sw;
          x[q] = v >= 0 && v < a.vw ? ToCompute(x_row[v * a.iv.w]) : T(0);
        }
#pragma unroll
        for (int c = 0; c < CO; ++c)
#pragma unroll
          for (int q = 0; q < TW; ++q) acc[c][q] += x[q] * f[c];
      }
    }
  }
  const int64_t col_elems = a.images * a.groups * a.cog;  // (img, group, co) per pixel
  const int64_t jc0 = (img * a.groups + grp) * a.cog + co0, out_img = OutImage(a, img);
#pragma unroll
  for (int q = 0; q < TW; ++q) {
    if (q >= nw) continue;
    const int64_t ow = ow0 + q;
#pragma unroll
    for (int c = 0; c < CO; ++c) {
      if (c >= nco) continue;
      if (a.partial) {
        static_cast<T*>(a.partial)[((split * a.out_h + oh) * a.out_w + ow) * col_elems + jc0 + c] =
            acc[c][q];
      } else {
        static_cast<S*>(a.out)[out_img + oh * a.ov.h + ow * a.ov.w + grp * a.ov.g +
                               (co0 + c) * a.ov.c] = FromCompute<S, T>(acc[c][q]);
      }
    }
  }
}

template <typename S, typename T, int CO, int TW>
__global__ void __launch_bounds__(kRedThreads) DirectReductionKernel(DirectArgs a) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < a.total;
       t += int64_t(gridDim.x) * blockDim.x)
    DirectReductionItem<S, T, CO, TW>(a, t);
}

// out = the reduction kernel's partial sums added in split order.
template <typename S, typename T>
TFBIGCONV_HD void ReduceRowSplitsItem(const DirectArgs& a, int64_t splits, int64_t i) {
  const T* part = static_cast<const T*>(a.partial);
  const int64_t col_elems = a.images * a.groups * a.cog;
  T sum = part[i];
  for (int64_t s = 1; s < splits; ++s) sum += part[s * a.out_elems + i];
  int64_t e = i % col_elems;
  const int64_t pix = i / col_elems, ow = pix % a.out_w, oh = pix / a.out_w;
  const int64_t co = e % a.cog;
  e /= a.cog;
  const int64_t grp = e % a.groups, img = e / a.groups;
  static_cast<S*>(a.out)[OutImage(a, img) + oh * a.ov.h + ow * a.ov.w + grp * a.ov.g +
                         co * a.ov.c] = FromCompute<S, T>(sum);
}

template <typename S, typename T>
__global__ void ReduceRowSplitsKernel(DirectArgs a, int64_t splits) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.out_elems;
       i += int64_t(gridDim.x) * blockDim.x)
    ReduceRowSplitsItem<S, T>(a, splits, i);
}

int64_t PatchElems(const ConvGeometry& g, int64_t kb_h, int64_t kb_w) {
  return ((kTileH - 1) * g.stride[kH] + (kb_h - 1) * g.dilation[kH] + 1) *
         ((kTileW - 1) * g.stride[kW] + (kb_w - 1) * g.dilation[kW] + 1);
}

template <typename S, typename T, int CO>
void LaunchReduction(const DirectArgs& a, const DirectGpuPlan& plan, cudaStream_t stream) {
  const unsigned grid = GridFor(a.total, kRedThreads);
  if (plan.red_width == 8)
    DirectReductionKernel<S, T, CO, 8><<<grid, kRedThreads, 0, stream>>>(a);
  else
    DirectReductionKernel<S, T, CO, 4><<<grid, kRedThreads, 0, stream>>>(a);
}

template <typename S>
std::string Launch(const DirectArgs& a, const DirectGpuPlan& plan, cudaStream_t stream) {
  using T = typename ComputeOf<S>::type;
  if (a.dw_vec > 0) {
    const unsigned grid = GridFor(a.total, kDepthwiseThreads);
    if (a.dw_vec == 8) DirectDepthwiseKernel<S, T, 8><<<grid, kDepthwiseThreads, 0, stream>>>(a);
    else if (a.dw_vec == 4) DirectDepthwiseKernel<S, T, 4><<<grid, kDepthwiseThreads, 0, stream>>>(a);
    else if (a.dw_vec == 2) DirectDepthwiseKernel<S, T, 2><<<grid, kDepthwiseThreads, 0, stream>>>(a);
    else DirectDepthwiseKernel<S, T, 1><<<grid, kDepthwiseThreads, 0, stream>>>(a);
    std::string err = LaunchError("direct convolution depthwise kernel");
    if (!err.empty() || !a.partial) return err;
    ReduceRowSplitsKernel<S, T><<<GridFor(a.out_elems, 256), 256, 0, stream>>>(a, plan.splits());
    return LaunchError("direct convolution split reduction");
  }
  if (plan.reduction) {
    if (plan.red_channels == 8) LaunchReduction<S, T, 8>(a, plan, stream);
    else if (plan.red_channels == 4) LaunchReduction<S, T, 4>(a, plan, stream);
    else LaunchReduction<S, T, 1>(a, plan, stream);
    std::string err = LaunchError("direct convolution reduction kernel");
    if (!err.empty() || !a.partial) return err;
    ReduceRowSplitsKernel<S, T><<<GridFor(a.out_elems, 256), 256, 0, stream>>>(a, plan.splits());
    return LaunchError("direct convolution split reduction");
  }
  if (plan.tiled) {
    const dim3 block(kBX, kBY);
    const unsigned grid = unsigned(std::min<int64_t>(a.total, int64_t(1) << 30));
    if (plan.channels_per_thread == 4)
      DirectTiledKernel<S, T, 4><<<grid, block, plan.shared_bytes, stream>>>(a);
    else
      DirectTiledKernel<S, T, 1><<<grid, block, plan.shared_bytes, stream>>>(a);
  } else {
    DirectUntiledKernel<S, T><<<GridFor(a.total, 256), 256, 0, stream>>>(a);
  }
  std::string err = LaunchError("direct convolution kernel");
  if (!err.empty() || !a.partial) return err;
  ReduceSplitsKernel<S, T><<<GridFor(a.out_elems, 256), 256, 0, stream>>>(a, plan.splits());
  return LaunchError("direct convolution split reduction");
}

// Splits the reduction rows (ci, kd, kh) of the reduction and depthwise kernels
// into ranges for partial sums: enough for kRedTargetThreads with `threads`
// per split, no fewer than kRedMinSteps multiply-adds per thread and split,
// halved until the partial sums fit `limit` (one split needs none).
void SplitRows(const ConvGeometry& g, DType dtype, int64_t limit, int64_t threads,
               DirectGpuPlan* p) {
  const int64_t rows = std::max<int64_t>(1, g.in_c_per_group() * g.filter[kD] * g.filter[kH]);
  const int64_t min_rows = CeilDiv(kRedMinSteps, std::max<int64_t>(1, g.filter[kW]));
  int64_t want = std::min(CeilDiv(kRedTargetThreads, threads), CeilDiv(rows, min_rows));
  const int64_t out_bytes = g.output_elements() * ComputeBytes(dtype);
  for (want = std::max<int64_t>(1, want);; want = CeilDiv(want, 2)) {
    p->rows_per_split = CeilDiv(rows, want);
    p->row_splits = CeilDiv(rows, p->rows_per_split);
    p->workspace_bytes = p->row_splits > 1 ? p->row_splits * out_bytes : 0;
    if (p->workspace_bytes <= limit || want == 1) break;
  }
}

// The reduction kernel where it suits (see DirectGpuPlan): small output rows,
// no input dilation in rows and columns (its row loop skips only padding and
// whole depth taps), a long reduction.
void PlanReduction(const ConvGeometry& g, DType dtype, int64_t limit, DirectGpuPlan* p) {
  const int64_t reduction = g.in_c_per_group() * g.filter[kD] * g.filter[kH] * g.filter[kW];
  if (g.in_dilation[kH] != 1 || g.in_dilation[kW] != 1 || g.out[kW] > kRedMaxOutW ||
      g.out[kD] * g.out[kH] * g.out[kW] > kRedMaxOutPixels || reduction < kRedMinReduction)
    return;
  const int64_t cog = g.out_c_per_group();
  p->reduction = true;
  p->red_channels = cog == 1 ? 1 : cog <= 4 ? 4 : 8;
  p->red_width = g.out[kW] <= 4 ? 4 : 8;
  const int64_t cols = g.batch * g.out[kD] * g.groups * CeilDiv(cog, p->red_channels);
  const int64_t threads = std::max<int64_t>(1, cols * g.out[kH] * CeilDiv(g.out[kW], p->red_width));
  SplitRows(g, dtype, limit, threads, p);
}

// The depthwise kernel (see DirectGpuPlan), its reduction rows split like
// the reduction kernel's where there are few outputs (backprop_filter).
void PlanDepthwise(const ConvGeometry& g, DType dtype, int64_t limit, DirectGpuPlan* p) {
  p->depthwise = true;
  p->tiled = false;
  p->ci_splits = p->kh_splits = 1;
  // Channel vectors of 4 assumed here (the launch picks the width): the split,
  // and with it the rounding, depends on the geometry alone.
  const int64_t threads = std::max<int64_t>(
      1, g.batch * g.out[kD] * g.out[kH] * CeilDiv(g.out[kW], int64_t(kDepthwiseCols)) *
             CeilDiv(g.groups, 4));
  SplitRows(g, dtype, limit, threads, p);
}

}  // namespace

DirectGpuPlan PlanDirectGpu(const ConvProblem& problem, DType dtype, int64_t limit) {
  const ConvGeometry& g = problem.g;
  DirectGpuPlan p;
  const int64_t tb = ComputeBytes(dtype), cog = g.out_c_per_group();
  p.channels_per_thread = cog >= 3 ? 4 : 1;
  // Largest sub-block whose patch and filter taps fit in shared memory.
  int64_t kb_h = std::min<int64_t>(kMaxSubBlock, g.filter[kH]);
  int64_t kb_w = std::min<int64_t>(kMaxSubBlock, g.filter[kW]);
  auto shared = [&](int64_t h, int64_t w) {
    return (PatchElems(g, h, w) + h * w * p.channels_per_thread) * tb;
  };
  while (shared(kb_h, kb_w) > kSharedBytes && (kb_h > 1 || kb_w > 1)) {
    if (kb_h >= kb_w) kb_h = CeilDiv(kb_h, 2);
    else kb_w = CeilDiv(kb_w, 2);
  }
  // Sub-blocks under 4x4 would reload the halo for every few taps.
  p.tiled = shared(kb_h, kb_w) <= kSharedBytes &&
            (kb_h >= std::min<int64_t>(4, g.filter[kH]) && kb_w >= std::min<int64_t>(4, g.filter[kW]));
  p.kb_h = p.tiled ? int(kb_h) : 1;
  p.kb_w = p.tiled ? int(kb_w) : 1;
  p.shared_bytes = p.tiled ? shared(kb_h, kb_w) : 0;

  const int64_t cig = g.in_c_per_group();
  const int64_t co_blocks = CeilDiv(cog, p.channels_per_thread);
  const int64_t base = p.tiled ? std::max<int64_t>(1, g.batch * g.out[kD] * g.groups * co_blocks *
                                                          CeilDiv(g.out[kH], kTileH) *
                                                          CeilDiv(g.out[kW], kTileW))
                               : CeilDiv(std::max<int64_t>(1, g.output_elements()), 256);
  const int64_t out_bytes = g.output_elements() * tb;
  // Splits cut between sub-blocks: units of (kd, kb_h filter rows).
  const int64_t kh_units = std::max<int64_t>(1, g.filter[kD] * CeilDiv(g.filter[kH], p.kb_h));
  for (int64_t want = std::min(kMaxSplits, CeilDiv(kTargetBlocks, base)); want >= 1; want /= 2) {
    p.ci_splits = std::max<int64_t>(1, std::min(cig, want));
    p.ci_per_split = std::max<int64_t>(1, CeilDiv(cig, p.ci_splits));
    p.ci_splits = std::max<int64_t>(1, CeilDiv(cig, p.ci_per_split));
    p.kh_splits = std::min(kh_units, CeilDiv(want, p.ci_splits));
    p.kh_per_split = CeilDiv(kh_units, p.kh_splits);
    p.kh_splits = CeilDiv(kh_units, p.kh_per_split);
    p.workspace_bytes = p.splits() > 1 ? p.splits() * out_bytes : 0;
    if (p.workspace_bytes <= limit || p.splits() == 1) break;
  }
  if (p.splits() == 1) p.workspace_bytes = 0;
  // Groups innermost with unit stride (NHWC, one input or one image per
  // group): a depthwise forward pass, its backprop_input and backprop_filter.
  // Taps per depth tap, as the tiled kernel runs each depth tap as a 2-D one.
  if (problem.in.g == 1 && problem.out.g == 1 && problem.filter.g == 1 && cog == 1 &&
      g.groups >= kDepthwiseMinGroups && g.filter[kH] * g.filter[kW] <= kDepthwiseMaxTaps)
    PlanDepthwise(g, dtype, limit, &p);
  else
    PlanReduction(g, dtype, limit, &p);
  p.seconds = double(g.macs()) / (p.tiled ? kTiledMacsPerSecond : kUntiledMacsPerSecond) *
              (dtype == DType::kDouble ? 2.0 : 1.0);
  return p;
}

namespace {

// The depthwise kernel's channel vector for these operands (the plan checked
// that groups are innermost with unit stride): the widest, at most 16 bytes,
// that divides the groups and every stride and offset and to which the
// pointers are aligned.
int64_t DepthwiseVector(const DirectGpuParams& p) {
  const ConvProblem& pr = p.problem;
  const int64_t item = StorageBytes(p.dtype);
  const int64_t steps[] = {pr.g.groups, pr.in.n, pr.in.d, pr.in.h, pr.in.w,
                           pr.out.n, pr.out.d, pr.out.h, pr.out.w, pr.filter.offset,
                           pr.filter.d, pr.filter.h, pr.filter.w};
  for (int64_t vec = std::min<int64_t>(8, 16 / item); vec > 1; vec /= 2) {
    const uint64_t align = uint64_t(vec * item);
    bool ok = reinterpret_cast<uintptr_t>(p.input) % align == 0 &&
              reinterpret_cast<uintptr_t>(p.filter) % align == 0 &&
              reinterpret_cast<uintptr_t>(p.output) % align == 0;
    for (int64_t st : steps) ok = ok && st % vec == 0;
    if (ok) return vec;
  }
  return 1;
}

// The kernels' arguments for a call (host side of every launch).
DirectArgs MakeArgs(const DirectGpuParams& p) {
  const ConvGeometry& g = p.problem.g;
  const DirectGpuPlan& plan = p.plan;
  DirectArgs a;
  FillGeometryArgs(p.problem, &a);
  a.in = p.input;
  a.filt = p.filter;
  a.out = p.output;
  a.partial = plan.splits() > 1 ? p.workspace : nullptr;
  a.images = g.batch * g.out[kD];
  a.tiles_h = CeilDiv(g.out[kH], kTileH);
  a.tiles_w = CeilDiv(g.out[kW], kTileW);
  a.co_blocks = CeilDiv(a.cog, plan.tiled ? plan.channels_per_thread : 1);
  a.ci_splits = plan.ci_splits;
  a.ci_per = plan.ci_per_split;
  a.kh_splits = plan.kh_splits;
  a.kh_per = plan.kh_per_split;
  a.kh_units = CeilDiv(g.filter[kH], int64_t(plan.kb_h));
  a.kb_h = plan.kb_h;
  a.kb_w = plan.kb_w;
  a.patch_max = plan.tiled ? PatchElems(g, plan.kb_h, plan.kb_w) : 0;
  a.out_elems = g.output_elements();
  a.total = plan.tiled ? a.images * g.groups * plan.splits() * a.co_blocks * a.tiles_h * a.tiles_w
                       : plan.splits() * a.out_elems;
  if (plan.reduction) {
    a.co_blocks = CeilDiv(a.cog, plan.red_channels);
    a.red_cols = a.images * g.groups * a.co_blocks;
    a.red_pieces = CeilDiv(g.out[kW], plan.red_width);
    a.red_rows = g.in_c_per_group() * g.filter[kD] * g.filter[kH];
    a.red_rows_per = plan.rows_per_split;
    a.total = plan.row_splits * g.out[kH] * a.red_pieces * a.red_cols;
  }
  a.dw_vec = plan.depthwise ? DepthwiseVector(p) : 0;
  if (plan.depthwise) {
    a.dw_vectors = g.groups / a.dw_vec;
    a.dw_pieces = CeilDiv(g.out[kW], int64_t(kDepthwiseCols));
    a.red_rows = g.in_c_per_group() * g.filter[kD] * g.filter[kH];
    a.red_rows_per = plan.rows_per_split;
    a.total = plan.row_splits * a.images * g.out[kH] * a.dw_pieces * a.dw_vectors;
  }
  return a;
}

// The kernels' bodies on the CPU, item by item in launch order (tests).
template <typename S>
std::string RunOnHost(const DirectArgs& a, const DirectGpuPlan& plan) {
  using T = typename ComputeOf<S>::type;
  if (a.dw_vec > 0) {
    for (int64_t t = 0; t < a.total; ++t) {
      if (a.dw_vec == 8) DirectDepthwiseItem<S, T, 8>(a, t);
      else if (a.dw_vec == 4) DirectDepthwiseItem<S, T, 4>(a, t);
      else if (a.dw_vec == 2) DirectDepthwiseItem<S, T, 2>(a, t);
      else DirectDepthwiseItem<S, T, 1>(a, t);
    }
    if (a.partial)
      for (int64_t i = 0; i < a.out_elems; ++i) ReduceRowSplitsItem<S, T>(a, plan.splits(), i);
    return "";
  }
  if (plan.reduction) {
    for (int64_t t = 0; t < a.total; ++t) {
      if (plan.red_channels == 8 && plan.red_width == 8) DirectReductionItem<S, T, 8, 8>(a, t);
      else if (plan.red_channels == 8) DirectReductionItem<S, T, 8, 4>(a, t);
      else if (plan.red_channels == 4 && plan.red_width == 8) DirectReductionItem<S, T, 4, 8>(a, t);
      else if (plan.red_channels == 4) DirectReductionItem<S, T, 4, 4>(a, t);
      else if (plan.red_width == 8) DirectReductionItem<S, T, 1, 8>(a, t);
      else DirectReductionItem<S, T, 1, 4>(a, t);
    }
    if (a.partial)
      for (int64_t i = 0; i < a.out_elems; ++i) ReduceRowSplitsItem<S, T>(a, plan.splits(), i);
    return "";
  }
  if (plan.tiled) return "direct convolution on the host: the tiled kernel is not emulated";
  for (int64_t i = 0; i < a.total; ++i) DirectUntiledItem<S, T>(a, i);
  if (a.partial)
    for (int64_t i = 0; i < a.out_elems; ++i) ReduceSplitsItem<S, T>(a, plan.splits(), i);
  return "";
}

}  // namespace

std::string DirectConvGpu(const DirectGpuParams& p, cudaStream_t stream) {
  if (p.problem.g.output_elements() == 0) return "";
  if (p.plan.splits() > 1 && !p.workspace)
    return "direct convolution: the plan's split reduction needs a workspace";
  std::string err = ActivateStreamDevice(stream);
  if (!err.empty()) return err;
  const DirectArgs a = MakeArgs(p);
  const DirectGpuPlan& plan = p.plan;
  switch (p.dtype) {
    case DType::kFloat: return Launch<float>(a, plan, stream);
    case DType::kDouble: return Launch<double>(a, plan, stream);
    case DType::kHalf: return Launch<__half>(a, plan, stream);
    case DType::kBFloat16: return Launch<__nv_bfloat16>(a, plan, stream);
  }
  return "direct convolution: unknown dtype";
}

std::string DirectConvOnHost(const DirectGpuParams& p) {
  if (p.problem.g.output_elements() == 0) return "";
  if (p.plan.splits() > 1 && !p.workspace)
    return "direct convolution: the plan's split reduction needs a workspace";
  const DirectArgs a = MakeArgs(p);
  switch (p.dtype) {
    case DType::kFloat: return RunOnHost<float>(a, p.plan);
    case DType::kDouble: return RunOnHost<double>(a, p.plan);
    case DType::kHalf: return RunOnHost<__half>(a, p.plan);
    case DType::kBFloat16: return RunOnHost<__nv_bfloat16>(a, p.plan);
  }
  return "direct convolution: unknown dtype";
}


}  // namespace gpu
}  // namespace tfbigconv
