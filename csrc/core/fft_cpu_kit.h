// The pieces the CPU FFT kernels share (fft_cpu.cc, fft_cpu_lanes.cc,
// fft_cpu_backprop.cc): spectrum products, staging with the overflow check,
// lane transforms (LaneKit), and the tile of an item. Internal to the core.
#pragma once

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>

#include "dtypes.h"
#include "fft_backend_cpu.h"
#include "fft_plan.h"
#include "geometry.h"

namespace tfbigconv {
namespace fft_cpu_internal {
// Frequency bins per channel-mixing work unit: the x, w and y blocks of one
// (item, channel) pair stay in L1.
constexpr int64_t kBinBlock = 256;
// Columns per block where a block of planes of height 1 is staged or written
// back: the block's planes share the tensor's cache lines, and each plane's
// part is one line of floats.
constexpr int64_t kColumnBlock = 16;
// Rows ahead that lane staging and write-back prefetch: NWC rows are the
// tensor's width apart, a few per page, beyond the hardware prefetcher's reach.
constexpr int64_t kLanePrefetchRows = 8;

// y = x * conj(w), or y += x * conj(w), over n complex values stored as
// interleaved (re, im) pairs. Correlation is convolution with conj(W).
template <typename T>
void MulConj(const T* __restrict x, const T* __restrict w, T* __restrict y, int64_t n,
             bool accumulate) {
  if (accumulate) {
    for (int64_t j = 0; j < 2 * n; j += 2) {
      y[j] += x[j] * w[j] + x[j + 1] * w[j + 1];
      y[j + 1] += x[j + 1] * w[j] - x[j] * w[j + 1];
    }
  } else {
    for (int64_t j = 0; j < 2 * n; j += 2) {
      y[j] = x[j] * w[j] + x[j + 1] * w[j + 1];
      y[j + 1] = x[j + 1] * w[j] - x[j] * w[j + 1];
    }
  }
}

// x = x * conj(w) in place: MulConj's products, each value read before it is written.
template <typename T>
void MulConjInPlace(T* __restrict x, const T* __restrict w, int64_t n) {
  for (int64_t j = 0; j < 2 * n; j += 2) {
    const T re = x[j], im = x[j + 1];
    x[j] = re * w[j] + im * w[j + 1];
    x[j + 1] = im * w[j] - re * w[j + 1];
  }
}

// Copies columns [c0, c1) of a row of the input (`stride` elements apart)
// to dst[c0, c1); returns whether all are at most `limit` in magnitude (false
// for a NaN). The check's flag stays in a register: folded into the caller's
// flag on every value, it went through the stack, a chain of loads and stores
// that took a third of the 1-D Hyena case's staging.
template <typename S, typename T>
__attribute__((noinline)) bool StageColumns(const S* src, int64_t stride, int64_t c0, int64_t c1, T* dst, T limit) {
  bool ok = true;
  for (int64_t c = c0; c < c1; ++c) {
    const T v = Load<T>(src[c * stride]);
    dst[c] = v;
    ok &= std::abs(v) <= limit;
  }
  return ok;
}

// Copies taps [k0, k1) of a filter row (`stride` elements apart) to
// dst[k * dilation]; returns their largest magnitude, and clears *finite on
// a NaN or Inf (FilterSpectra stages every tap row with it). As in
// StageColumns, the running values stay in registers.
template <typename S, typename T>
__attribute__((noinline)) T StageTaps(const S* src, int64_t stride, int64_t k0, int64_t k1,
                                      T* dst, int64_t dilation, bool* finite) {
  T most = 0;
  bool ok = true;
  for (int64_t k = k0; k < k1; ++k) {
    const T v = Load<T>(src[k * stride]);
    dst[k * dilation] = v;
    most = std::max(most, std::abs(v));
    ok &= std::abs(v) <= std::numeric_limits<T>::max();  // false for NaN
  }
  *finite &= ok;
  return most;
}

// Whether n pointers are evenly spaced (*step apart, in elements): planes of
// height 1 (1-D problems) whose spectra are go to ducc0 as the rows of one
// call, which it vectorises across.
template <typename P>
bool EvenlySpaced(P* const* p, int64_t n, int64_t* step) {
  *step = n > 1 ? p[1] - p[0] : 0;
  for (int64_t i = 2; i < n; ++i)
    if (p[i] - p[i - 1] != *step) return false;
  return n > 1 && *step > 0;
}

// A pointer rounded up to kLaneAlignBytes (the plan holds the slack).
template <typename T>
T* AlignLanes(char* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<T*>((u + kLaneAlignBytes - 1) & ~uintptr_t(kLaneAlignBytes - 1));
}

// |v| as an unsigned integer of v's width: ordered as the magnitudes are,
// with Inf and then NaN above every finite value. An integer max over them
// vectorizes where a float max (whose NaN order is the operands') does not;
// the lane kit's staging takes its largest magnitude and its finiteness check
// from one such max.
template <typename T>
struct MagnitudeBits;
template <>
struct MagnitudeBits<float> {
  using U = uint32_t;
  static constexpr U kAbs = 0x7fffffffu, kInf = 0x7f800000u;
};
template <>
struct MagnitudeBits<double> {
  using U = uint64_t;
  static constexpr U kAbs = 0x7fffffffffffffffull, kInf = 0x7ff0000000000000ull;
};
template <typename T>
typename MagnitudeBits<T>::U Magnitude(T v) {
  typename MagnitudeBits<T>::U u;
  std::memcpy(&u, &v, sizeof(v));
  return u & MagnitudeBits<T>::kAbs;
}

// Lane transforms on group buffers: kFftLanes rows of n points each, in
// fft::LaneFft's layout (lane j's position i at off_[j] + i * v, v the
// backend's vector width, a group being kFftLanes / v vector blocks).
// Staging from a tensor (S) into buffers (T), products of halfcomplex
// spectra, transforms and write-back. Lane plans (LaneRunner) and
// the fused backward (LaneBackprop) use it.
template <typename S, typename T>
class LaneKit {
 public:
  explicit LaneKit(int64_t n) : fft_(n), n_(n), v_(fft_.width()) {
    for (int64_t j = 0; j < kFftLanes; ++j) off_[j] = (j / v_) * n_ * v_ + j % v_;
  }

  // Whether the plan's buffers serve this backend: its vectors divide a
  // group, and its scratch fits the two group buffers plans hold (7-smooth
  // sizes need at most 1.1 x the points).
  bool Fits() const {
    return v_ > 0 && kFftLanes % v_ == 0 && fft_.scratch_elements() <= 2 * GroupValues();
  }
  int64_t GroupValues() const { return kFftLanes * n_; }

  // Lanes [0, nl) of `base` (lane j at base + j * lane_stride) into the
  // group buffers bufs[j / kFftLanes]: sample s at s * step goes to position
  // first + s * spacing; every other position, and every lane beyond nl, is
  // zero. Returns the largest magnitude staged and clears *finite on a NaN
  // or an Inf.
  T Stage(const S* base, int64_t lane_stride, int64_t nl, T* const* bufs, int64_t first,
          int64_t count, int64_t step, int64_t spacing, bool* finite) const {
    const int64_t ng = CeilDiv(nl, kFftLanes);
    for (int64_t q = 0; q < ng; ++q) {
      if (spacing == 1 && count > 0) {
        ZeroPositions(bufs[q], 0, first);
        ZeroPositions(bufs[q], first + count, n_);
      } else {
        ZeroPositions(bufs[q], 0, n_);
      }
    }
    // NWC: a row's lanes are adjacent, and a set of groups covers whole cache
    // lines, fetched a few rows ahead (the rows are the tensor's width apart).
    const bool dense = lane_stride == 1 && v_ == kFftLanes;
    const int64_t row_bytes = nl * int64_t(sizeof(S));
    using M = MagnitudeBits<T>;
    typename M::U most = 0;
    for (int64_t s = 0; s < count; ++s) {
      const S* row = base + s * step;
      if (lane_stride == 1)
        for (int64_t b = 0; b < row_bytes; b += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(row + kLanePrefetchRows * step) + b);
      const int64_t pos = first + s * spacing;
      for (int64_t q = 0; q < ng; ++q) {
        const int64_t n_in = std::min(kFftLanes, nl - q * kFftLanes);
        const S* r = row + q * kFftLanes * lane_stride;
        if (dense && n_in == kFftLanes) {
          T* d = bufs[q] + pos * kFftLanes;
          for (int64_t j = 0; j < kFftLanes; ++j) {
            const T v = Load<T>(r[j]);
            d[j] = v;
            most = std::max(most, Magnitude(v));
          }
        } else {
          T* d = bufs[q] + pos * v_;
          for (int64_t j = 0; j < kFftLanes; ++j) {
            const T v = j < n_in ? Load<T>(r[j * lane_stride]) : T(0);
            d[off_[j]] = v;
            most = std::max(most, Magnitude(v));
          }
        }
      }
    }
    if (most >= M::kInf) *finite = false;  // an Inf or a NaN
    T largest;
    std::memcpy(&largest, &most, sizeof(largest));
    return largest;
  }

  // Lanes [0, nl) of positions first + c * spacing, c < count, of the
  // group buffers to base + c * step (lane j at + j * lane_stride).
  void Write(const T* const* bufs, int64_t nl, int64_t first, int64_t count, int64_t spacing,
             S* base, int64_t lane_stride, int64_t step) const {
    const int64_t ng = CeilDiv(nl, kFftLanes);
    const bool dense = lane_stride == 1 && v_ == kFftLanes;
    const int64_t row_bytes = nl * int64_t(sizeof(S));
    for (int64_t c = 0; c < count; ++c) {
      S* row = base + c * step;
      if (lane_stride == 1)
        for (int64_t b = 0; b < row_bytes; b += 64)
          __builtin_prefetch(reinterpret_cast<char*>(row + kLanePrefetchRows * step) + b, 1);
      const int64_t pos = first + c * spacing;
      for (int64_t q = 0; q < ng; ++q) {
        const int64_t n_out = std::min(kFftLanes, nl - q * kFftLanes);
        S* r = row + q * kFftLanes * lane_stride;
        if (dense && n_out == kFftLanes) {
          const T* src = bufs[q] + pos * kFftLanes;
          for (int64_t j = 0; j < kFftLanes; ++j) r[j] = Store<S, T>(src[j]);
        } else {
          const T* src = bufs[q] + pos * v_;
          for (int64_t j = 0; j < n_out; ++j) r[j * lane_stride] = Store<S, T>(src[off_[j]]);
        }
      }
    }
  }

  // A group buffer's transform, one vector block at a time; the inverse
  // scaled by 1 / points.
  void Transform(T* buf, T* scratch, bool forward) const {
    const T scale = T(1) / T(n_);
    for (int64_t blk = 0; blk < kFftLanes / v_; ++blk) {
      T* b = buf + blk * n_ * v_;
      if (forward) fft_.Forward(b, scratch);
      else fft_.Backward(b, scratch, scale);
    }
  }

  // y = x * conj(w) (conj) or x * w, or y += it, on halfcomplex lane
  // spectra; y may be x.
  void Mul(const T* x, const T* w, T* y, bool conj, bool accumulate) const {
    if (v_ == kFftLanes) return MulOf<kFftLanes>(x, w, y, conj, accumulate);
    MulOf<0>(x, w, y, conj, accumulate);
  }

  // The fused backward's two products in one pass over the spectra:
  // sum (+)= x * conj(dy), then dy = dy * w.
  void MulBackprop(const T* x, T* dy, const T* w, T* sum, bool accumulate) const {
    if (v_ == kFftLanes) return MulBackpropOf<kFftLanes>(x, dy, w, sum, accumulate);
    MulBackpropOf<0>(x, dy, w, sum, accumulate);
  }

 private:
  // Mul and MulBackprop for vectors of V values (0: the backend's v_). A
  // fixed V lets the compiler unroll and vectorise the lanes; each position
  // pair's products go through locals, so that y may be x.
  template <int64_t V>
  void MulOf(const T* x, const T* w, T* y, bool conj, bool accumulate) const {
    const int64_t n = n_, v = V > 0 ? V : v_;
    const T sign = conj ? T(1) : T(-1);
    for (int64_t blk = 0; blk < kFftLanes / v; ++blk) {
      const int64_t o = blk * n * v;
      const T *xb = x + o, *wb = w + o;
      T* yb = y + o;
      // Bin 0, and bin n/2 when n is even, are real.
      const int64_t last = n % 2 == 0 ? n - 1 : n;
      for (int64_t i : {int64_t(0), last}) {
        if (i >= n) continue;
        for (int64_t j = 0; j < v; ++j) {
          const T p = xb[i * v + j] * wb[i * v + j];
          yb[i * v + j] = accumulate ? yb[i * v + j] + p : p;
        }
      }
      for (int64_t i = 1; i + 1 < n; i += 2) {
        const T* xr = xb + i * v;
        const T* wr = wb + i * v;
        T* yr = yb + i * v;
        T re[kFftLanes], im[kFftLanes];
        for (int64_t j = 0; j < v; ++j) {
          const T a = xr[j], b = xr[v + j], c = wr[j], d = sign * wr[v + j];
          re[j] = a * c + b * d;
          im[j] = b * c - a * d;
        }
        if (accumulate) {
          for (int64_t j = 0; j < v; ++j) {
            yr[j] += re[j];
            yr[v + j] += im[j];
          }
        } else {
          for (int64_t j = 0; j < v; ++j) {
            yr[j] = re[j];
            yr[v + j] = im[j];
          }
        }
      }
    }
  }

  template <int64_t V>
  void MulBackpropOf(const T* x, T* dy, const T* w, T* sum, bool accumulate) const {
    const int64_t n = n_, v = V > 0 ? V : v_;
    for (int64_t blk = 0; blk < kFftLanes / v; ++blk) {
      const int64_t o = blk * n * v;
      const T *xb = x + o, *wb = w + o;
      T *db = dy + o, *sb = sum + o;
      const int64_t last = n % 2 == 0 ? n - 1 : n;  // bins 0 and n/2 are real
      for (int64_t i : {int64_t(0), last}) {
        if (i >= n) continue;
        for (int64_t j = 0; j < v; ++j) {
          const int64_t k = i * v + j;
          const T p = xb[k] * db[k];
          sb[k] = accumulate ? sb[k] + p : p;
          db[k] = db[k] * wb[k];
        }
      }
      for (int64_t i = 1; i + 1 < n; i += 2) {
        const T* xr = xb + i * v;
        const T* wr = wb + i * v;
        T* dr = db + i * v;
        T* sr = sb + i * v;
        T re[kFftLanes], im[kFftLanes], dre[kFftLanes], dim[kFftLanes];
        for (int64_t j = 0; j < v; ++j) {
          const T a = xr[j], b = xr[v + j], c = dr[j], d = dr[v + j];
          re[j] = a * c + b * d;
          im[j] = b * c - a * d;
          const T e = wr[j], f = wr[v + j];
          dre[j] = c * e - d * f;
          dim[j] = d * e + c * f;
        }
        for (int64_t j = 0; j < v; ++j) {
          sr[j] = accumulate ? sr[j] + re[j] : re[j];
          sr[v + j] = accumulate ? sr[v + j] + im[j] : im[j];
          dr[j] = dre[j];
          dr[v + j] = dim[j];
        }
      }
    }
  }

  // Positions [a, b) of every lane of a group buffer.
  void ZeroPositions(T* buf, int64_t a, int64_t b) const {
    if (b <= a) return;
    for (int64_t blk = 0; blk < kFftLanes / v_; ++blk) {
      T* p = buf + blk * n_ * v_;
      std::fill(p + a * v_, p + b * v_, T(0));
    }
  }

  const fft::LaneFft<T> fft_;
  const int64_t n_, v_;
  int64_t off_[kFftLanes] = {};
};

// The largest input magnitude that transforms of `points` take safely with
// filter values up to w_max, summed over `terms` input channels of `taps`
// filter taps: each spectrum value is at most points x max |x| (or taps x
// max |w|), the sum adds `terms` products of two such (each of up to 2 real
// products), and the unscaled inverse multiplies by the points again. A
// factor 2 to spare.
template <typename T>
T FftInputLimit(double points, double terms, double taps, T w_max) {
  if (w_max == 0) return std::numeric_limits<T>::max();
  const double growth = 4.0 * points * points * terms * taps * double(w_max);
  return T(std::min(double(std::numeric_limits<T>::max()),
                    double(std::numeric_limits<T>::max()) / growth));
}

// Where an item's tile sits: image, first output slice/row/col, valid extent.
struct Tile {
  int64_t n, od0, oh0, ow0, vd, vh, vw;
};

// Item `item` of plan p: images in order, each's tiles depth-, then row-,
// then column-major.
inline Tile TileOfItem(const ConvGeometry& g, const FftPlan& p, int64_t item) {
  const int64_t per_image = p.tiles_d * p.tiles_h * p.tiles_w;
  const int64_t t = item % per_image;
  Tile r;
  r.n = item / per_image;
  r.od0 = (t / (p.tiles_h * p.tiles_w)) * p.tile_d;
  r.oh0 = (t / p.tiles_w % p.tiles_h) * p.tile_h;
  r.ow0 = (t % p.tiles_w) * p.tile_w;
  r.vd = std::min(p.tile_d, g.out[kD] - r.od0);
  r.vh = std::min(p.tile_h, g.out[kH] - r.oh0);
  r.vw = std::min(p.tile_w, g.out[kW] - r.ow0);
  return r;
}

// A tile's input window: it starts at (virtual, see in_dilation) input
// position (d0, h0, w0), and only its slices [z_lo, z_hi), rows [r_lo, r_hi)
// and columns [c_lo, c_hi) can hold input values; the rest is padding.
struct Window {
  int64_t d0, h0, w0, z_lo, z_hi, r_lo, r_hi, c_lo, c_hi;
  bool only_padding() const { return z_hi == z_lo || r_hi == r_lo || c_hi == c_lo; }
};

inline Window WindowOf(const ConvGeometry& g, const Tile& t) {
  const int64_t need[kSpatialAxes] = {(t.vd - 1) * g.stride[kD] + g.effective_filter(kD),
                                      (t.vh - 1) * g.stride[kH] + g.effective_filter(kH),
                                      (t.vw - 1) * g.stride[kW] + g.effective_filter(kW)};
  const int64_t first[kSpatialAxes] = {t.od0 * g.stride[kD] - g.pad_before[kD],
                                       t.oh0 * g.stride[kH] - g.pad_before[kH],
                                       t.ow0 * g.stride[kW] - g.pad_before[kW]};
  int64_t lo[kSpatialAxes], hi[kSpatialAxes];
  for (int a = 0; a < kSpatialAxes; ++a) {
    lo[a] = std::min(need[a], std::max<int64_t>(0, -first[a]));
    hi[a] = std::max(lo[a], std::min(need[a], g.virtual_in(a) - first[a]));
  }
  return {first[kD], first[kH], first[kW], lo[kD], hi[kD], lo[kH], hi[kH], lo[kW], hi[kW]};
}

// The spectrum (fft_d x fft_h x bins_w) of a real plane of plan p whose
// nonzero values lie in slices [z0, z1) and, in each, rows [r0, r1): staged
// slice z - z0 row r - r0 at st + (z - z0) * fft_h * fft_w + (r - r0) *
// fft_w. Rows and slices that are zero skip their transforms; the depth
// transform (3-D) runs last.
template <typename T>
void ForwardPlaneSpectrum(const FftPlan& p, const T* st, std::complex<T>* spec, int64_t z0,
                          int64_t z1, int64_t r0, int64_t r1) {
  using C = std::complex<T>;
  const int64_t fw = p.fft_w, bw = p.bins_w(), sb = p.fft_h * bw;
  std::fill(spec, spec + z0 * sb, C(0));
  std::fill(spec + z1 * sb, spec + p.fft_d * sb, C(0));
  for (int64_t z = z0; z < z1; ++z) {
    C* slice = spec + z * sb;
    std::fill(slice, slice + r0 * bw, C(0));
    fft::RealRowsForward(st + (z - z0) * p.fft_h * fw, fw, r1 - r0, fw, slice + r0 * bw, bw);
    std::fill(slice + r1 * bw, slice + p.fft_h * bw, C(0));
    fft::ComplexColumns(slice, p.fft_h, bw, bw, true);
  }
  fft::ComplexColumns(spec, p.fft_d, sb, sb, true);
}

// The inverse of a mixed spectrum y of a plan with fft_h > 1 or fft_d > 1,
// in place, keeping what tile t's stride samples: the depth transform, then
// of each kept slice the columns and the kept rows, slice z's rows at st + z
// * fft_h * fft_w, fft_w apart, times scale.
template <typename T>
void InversePlaneSpectrum(const ConvGeometry& g, const FftPlan& p, const Tile& t,
                          std::complex<T>* y, T* st, T scale) {
  const int64_t bw = p.bins_w(), sb = p.fft_h * bw;
  fft::ComplexColumns(y, p.fft_d, sb, sb, false);
  for (int64_t z = 0; z < t.vd; ++z) {
    std::complex<T>* slice = y + z * g.stride[kD] * sb;
    fft::ComplexColumns(slice, p.fft_h, bw, bw, false);
    fft::RealRowsBackward(slice, g.stride[kH] * bw, t.vh, p.fft_w, st + z * p.fft_h * p.fft_w,
                          p.fft_w, scale);
  }
}

}  // namespace fft_cpu_internal
}  // namespace tfbigconv
