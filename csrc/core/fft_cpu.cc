#include "fft_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "checked_math.h"
#include "direct_cpu.h"
#include "fft_backend_cpu.h"
#include "isa.h"

namespace tfbigconv {
namespace {

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

// Lane transforms on group buffers: kFftLanes rows of n points each, in
// fft::LaneFft's layout (lane j's position i at off_[j] + i * v, v the
// backend's vector width, a group being kFftLanes / v vector blocks).
// Staging from a tensor (S) into buffers (T), products of halfcomplex
// spectra, transforms and write-back. Lane plans (FftRunner::RunLanes) and
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
    T most = 0;
    bool ok = true;
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
            most = std::max(most, std::abs(v));
            ok &= std::abs(v) <= std::numeric_limits<T>::max();  // false for NaN
          }
        } else {
          T* d = bufs[q] + pos * v_;
          for (int64_t j = 0; j < kFftLanes; ++j) {
            const T v = j < n_in ? Load<T>(r[j * lane_stride]) : T(0);
            d[off_[j]] = v;
            most = std::max(most, std::abs(v));
            ok &= std::abs(v) <= std::numeric_limits<T>::max();
          }
        }
      }
    }
    *finite &= ok;
    return most;
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
    const int64_t n = n_, v = v_;
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
        for (int64_t j = 0; j < v; ++j) {
          const T a = xr[j], b = xr[v + j], c = wr[j], d = sign * wr[v + j];
          const T re = a * c + b * d, im = b * c - a * d;
          yr[j] = accumulate ? yr[j] + re : re;
          yr[v + j] = accumulate ? yr[v + j] + im : im;
        }
      }
    }
  }

  // The fused backward's two products in one pass over the spectra:
  // sum (+)= x * conj(dy), then dy = dy * w.
  void MulBackprop(const T* x, T* dy, const T* w, T* sum, bool accumulate) const {
    const int64_t n = n_, v = v_;
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
        for (int64_t j = 0; j < v; ++j) {
          const T a = xr[j], b = xr[v + j], c = dr[j], d = dr[v + j];
          const T re = a * c + b * d, im = b * c - a * d;
          sr[j] = accumulate ? sr[j] + re : re;
          sr[v + j] = accumulate ? sr[v + j] + im : im;
          const T e = wr[j], f = wr[v + j];
          dr[j] = c * e - d * f;
          dr[v + j] = d * e + c * f;
        }
      }
    }
  }

 private:
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

template <typename S, typename T>
class FftRunner {
  using C = std::complex<T>;

 public:
  explicit FftRunner(const FftParams& p)
      : params_(p),
        g_(p.problem.g),
        pl_(p.plan),
        in_(static_cast<const S*>(p.input)),
        filt_(static_cast<const S*>(p.filter)),
        out_(static_cast<S*>(p.output)),
        iv_(p.problem.in),
        ov_(p.problem.out),
        fv_(p.problem.filter),
        bw_(pl_.bins_w()),
        bins_(pl_.bins()),
        unsafe_(new std::atomic<bool>[pl_.lanes ? pl_.items : pl_.chunk]) {
    char* ws = static_cast<char*>(p.workspace);
    wspec_ = reinterpret_cast<C*>(ws);
    items_ = reinterpret_cast<C*>(ws + pl_.filter_spectra_bytes);
    workers_ = ws + pl_.filter_spectra_bytes + pl_.chunk * pl_.item_spectra_bytes;
  }

  void Run(const ParallelFor& pf) {
    if (pl_.lanes) return RunLanes(pf);
    const int64_t cig = g_.in_c_per_group(), cout = g_.out_c, groups = g_.groups;
    const int64_t blocks = pl_.ci_blocks(g_);
    const int64_t stage = std::min(std::max<int64_t>(1, pl_.stage_planes), kMaxStagePlanes);
    const bool plane_local = PlaneLocalFft(g_, pl_);
    for (int64_t c0 = 0; c0 < pl_.items; c0 += pl_.chunk) {
      const int64_t n = std::min(pl_.chunk, pl_.items - c0);
      for (int64_t i = 0; i < n; ++i) unsafe_[i].store(false, std::memory_order_relaxed);
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t ci0 = blk * pl_.ci_block, nci = std::min(pl_.ci_block, cig - ci0);
        // One block's filter spectra serve every chunk when there is one block.
        if (blocks > 1 || c0 == 0) {
          // Planes (co, ci) in the order i = (ci - ci0) * cout + co: a task's
          // block of adjacent output channels shares cache lines.
          filter_max_.store(0, std::memory_order_relaxed);
          const int64_t planes = cout * nci;
          pf(CeilDiv(planes, stage), [&](int64_t b, int64_t e, int worker) {
            T block_max = 0;
            for (int64_t i = b; i < e; ++i)
              block_max = std::max(block_max, FilterSpectra(i * stage, std::min(planes, (i + 1) * stage),
                                                            ci0, Staging(worker)));
            RaiseFilterMax(block_max);
          });
          const T w_max = filter_max_.load(std::memory_order_relaxed);
          if (!(w_max <= std::numeric_limits<T>::max())) {
            // A NaN or Inf in the filter reaches every output of its channel:
            // the direct kernel places it as tf.nn.conv2d does. Filter blocks
            // are the same in every chunk, so this happens in the first one,
            // before any output is written.
            DirectConv(Direct(params_.problem), pf, ActiveIsa());
            return;
          }
          x_limit_ = InputLimit(w_max);
        }
        // An item's input planes (grp, ci) in the order j = (ci - ci0) *
        // groups + grp, in blocks of `stage`.
        const int64_t per_item = groups * nci, in_tasks = CeilDiv(per_item, stage);
        if (plane_local) {
          // Plane j is output channel j's only input: a task transforms,
          // mixes and inverts its block in its worker's spectra, and no item
          // spectra are written and read back. Tasks go block by block, the
          // chunk's items within each, so that a worker's blocks of filter
          // spectra stay in cache across the items.
          pf(n * in_tasks, [&](int64_t b, int64_t e, int worker) {
            for (int64_t i = b; i < e; ++i) {
              const int64_t slot = i % n, j0 = (i / n) * stage;
              const int64_t j1 = std::min(per_item, j0 + stage);
              ForwardItem(c0 + slot, slot, j0, j1, ci0, Staging(worker), WorkerSpectrum(worker));
              if (!unsafe_[slot].load(std::memory_order_relaxed))
                InverseItem(c0 + slot, slot, j0, j1, worker, /*transformed_here=*/true);
            }
          });
          continue;
        }
        pf(n * in_tasks, [&](int64_t b, int64_t e, int worker) {
          for (int64_t i = b; i < e; ++i) {
            const int64_t slot = i / in_tasks, j0 = (i % in_tasks) * stage;
            ForwardItem(c0 + slot, slot, j0, std::min(per_item, j0 + stage), ci0, Staging(worker));
          }
        });
        if (!pl_.fused_mix) {
          pf((bins_ + kBinBlock - 1) / kBinBlock, [&](int64_t b, int64_t e, int) {
            for (int64_t bb = b; bb < e; ++bb) MixBlock(n, bb * kBinBlock, ci0, nci);
          });
        }
      }
      const int64_t out_tasks = plane_local ? 0 : CeilDiv(cout, stage);
      pf(n * out_tasks, [&](int64_t b, int64_t e, int worker) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t slot = i / out_tasks, co0 = (i % out_tasks) * stage;
          if (unsafe_[slot].load(std::memory_order_relaxed)) continue;
          InverseItem(c0 + slot, slot, co0, std::min(cout, co0 + stage), worker);
        }
      });
      // Tiles whose window holds a NaN, an Inf or a value the transforms
      // could overflow with: the direct kernel, as tf.nn.conv2d computes them.
      for (int64_t slot = 0; slot < n; ++slot)
        if (unsafe_[slot].load(std::memory_order_relaxed)) DirectTile(c0 + slot, pf);
    }
  }

 private:
  // The largest input magnitude this plan's transforms take safely with
  // filter values up to w_max (FftInputLimit).
  T InputLimit(T w_max) const {
    return FftInputLimit(double(Plane()), double(g_.in_c_per_group()),
                         double(g_.filter_d) * double(g_.filter_h) * double(g_.filter_w), w_max);
  }

  void RaiseFilterMax(T v) {
    T cur = filter_max_.load(std::memory_order_relaxed);
    // NaN compares false both ways: once stored, it stays.
    while ((v > cur || (v != v && cur == cur)) &&
           !filter_max_.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
    }
  }

  // The problem restricted to a tile: image n, output slices [od0, od0 + vd),
  // rows [oh0, oh0 + vh) and columns [ow0, ow0 + vw) (the whole output when
  // there is no tile), with pointers to match.
  DirectParams Direct(const ConvProblem& problem, const Tile* tile = nullptr) const {
    DirectParams d;
    d.problem = problem;
    d.dtype = params_.dtype;
    d.input = in_;
    d.filter = filt_;
    d.output = out_;
    if (tile == nullptr) return d;
    const Tile& t = *tile;
    ConvGeometry& g = d.problem.g;
    g.batch = 1;
    g.out_d = t.vd;
    g.out_h = t.vh;
    g.out_w = t.vw;
    g.pad_front -= t.od0 * g.stride_d;  // may turn negative: cropping
    g.pad_top -= t.oh0 * g.stride_h;
    g.pad_left -= t.ow0 * g.stride_w;
    g.pad_back = (t.vd - 1) * g.stride_d + g.effective_filter_d() - g.virtual_in_d() - g.pad_front;
    g.pad_bottom = (t.vh - 1) * g.stride_h + g.effective_filter_h() - g.virtual_in_h() - g.pad_top;
    g.pad_right = (t.vw - 1) * g.stride_w + g.effective_filter_w() - g.virtual_in_w() - g.pad_left;
    d.input = in_ + t.n * iv_.n;
    d.output = out_ + t.n * ov_.n + t.od0 * ov_.d + t.oh0 * ov_.h + t.ow0 * ov_.w;
    return d;
  }

  void DirectTile(int64_t item, const ParallelFor& pf) const {
    const Tile t = TileOf(item);
    DirectConv(Direct(params_.problem, &t), pf, ActiveIsa());
  }

  char* Worker(int worker) const { return workers_ + int64_t(worker) * pl_.worker_bytes; }
  // The worker's stage_planes real planes of fft_d x fft_h x fft_w (volumes
  // in 3-D, of slices of fft_h x fft_w), one after another.
  T* Staging(int worker) const { return reinterpret_cast<T*>(Worker(worker)); }
  int64_t Plane() const { return pl_.fft_d * Slice(); }
  int64_t Slice() const { return pl_.fft_h * pl_.fft_w; }
  // Bins of one depth slice of a spectrum.
  int64_t SliceBins() const { return pl_.fft_h * bw_; }
  // A problem of height and depth 1 (1-D): one row per plane.
  bool OneRow() const { return pl_.fft_h == 1 && pl_.fft_d == 1; }
  C* WorkerSpectrum(int worker) const {
    return reinterpret_cast<C*>(Worker(worker) + pl_.stage_planes * Plane() * int64_t(sizeof(T)));
  }
  // Per item: groups * ci_block input spectra (this block's channels), then
  // out_c output spectra unless mixing is fused.
  int64_t ItemSpectra() const {
    return g_.groups * pl_.ci_block + (pl_.fused_mix ? 0 : g_.out_c);
  }
  C* X(int64_t slot, int64_t grp, int64_t ci) const {
    return items_ + (slot * ItemSpectra() + grp * pl_.ci_block + ci % pl_.ci_block) * bins_;
  }
  C* Y(int64_t slot, int64_t co) const {
    return items_ + (slot * ItemSpectra() + g_.groups * pl_.ci_block + co) * bins_;
  }
  C* W(int64_t co, int64_t ci) const {
    return wspec_ + (co * pl_.ci_block + ci % pl_.ci_block) * bins_;
  }

  void ZeroRows(C* spec, int64_t r0, int64_t r1) const {
    if (r1 > r0) std::fill(spec + r0 * bw_, spec + r1 * bw_, C(0));
  }

  // The spectrum of a staged plane whose nonzero values lie in slices [z0,
  // z1) and, in each, rows [r0, r1): staged slice z - z0 row r - r0 at
  // st + (z - z0) * Slice() + (r - r0) * fft_w. Rows and slices that are zero
  // skip their transforms; the depth transform (3-D) runs last.
  void ForwardSpectrum(const T* st, C* spec, int64_t z0, int64_t z1, int64_t r0, int64_t r1) const {
    const int64_t fw = pl_.fft_w, sb = SliceBins();
    std::fill(spec, spec + z0 * sb, C(0));
    std::fill(spec + z1 * sb, spec + pl_.fft_d * sb, C(0));
    for (int64_t z = z0; z < z1; ++z) {
      C* slice = spec + z * sb;
      ZeroRows(slice, 0, r0);
      fft::RealRowsForward(st + (z - z0) * Slice(), fw, r1 - r0, fw, slice + r0 * bw_, bw_);
      ZeroRows(slice, r1, pl_.fft_h);
      fft::ComplexColumns(slice, pl_.fft_h, bw_, bw_, true);
    }
    fft::ComplexColumns(spec, pl_.fft_d, sb, sb, true);
  }

  // Spectra of the dilated filter tap planes i in [i0, i1) of the block
  // starting at input channel ci0 (co = i % out_c, ci = ci0 + i / out_c, ci
  // within its group), placed at the origin. Returns their largest magnitude
  // (NaN or Inf if one holds one), found while staging them.
  T FilterSpectra(int64_t i0, int64_t i1, int64_t ci0, T* st) const {
    const int64_t ed = g_.effective_filter_d(), eh = g_.effective_filter_h(), fw = pl_.fft_w;
    const int64_t cog = g_.out_c_per_group(), cout = g_.out_c, np = i1 - i0;
    const S* f[kMaxStagePlanes];
    for (int64_t p = 0; p < np; ++p) {
      const int64_t co = (i0 + p) % cout, ci = ci0 + (i0 + p) / cout;
      f[p] = filt_ + fv_.offset + ci * fv_.i + (co / cog) * fv_.g + (co % cog) * fv_.o;
      for (int64_t z = 0; z < ed; ++z)
        std::fill(st + p * Plane() + z * Slice(), st + p * Plane() + z * Slice() + eh * fw, T(0));
    }
    T w_max = 0;
    bool finite = true;
    // Across the block, where the planes' taps share cache lines: per tap row,
    // or at height 1, whose one row can be the whole filter, per column block.
    if (OneRow()) {
      for (int64_t k0 = 0; k0 < g_.filter_w; k0 += kColumnBlock) {
        const int64_t k1 = std::min(g_.filter_w, k0 + kColumnBlock);
        for (int64_t p = 0; p < np; ++p)
          w_max = std::max(w_max, StageTaps(f[p], fv_.w, k0, k1, st + p * Plane(),
                                            g_.dilation_w, &finite));
      }
    } else {
      for (int64_t kd = 0; kd < g_.filter_d; ++kd)
        for (int64_t kh = 0; kh < g_.filter_h; ++kh)
          for (int64_t p = 0; p < np; ++p)
            w_max = std::max(w_max, StageTaps(f[p] + kd * fv_.d + kh * fv_.h, fv_.w, 0,
                                              g_.filter_w,
                                              st + p * Plane() + kd * g_.dilation_d * Slice() +
                                                  kh * g_.dilation_h * fw,
                                              g_.dilation_w, &finite));
    }
    if (!finite) return std::numeric_limits<T>::infinity();
    C* spec[kMaxStagePlanes];
    for (int64_t p = 0; p < np; ++p) spec[p] = W((i0 + p) % cout, ci0 + (i0 + p) / cout);
    int64_t step;
    if (OneRow() && EvenlySpaced(spec, np, &step)) {
      fft::RealRowsForward(st, Plane(), np, fw, spec[0], step);
      return w_max;
    }
    for (int64_t p = 0; p < np; ++p) ForwardSpectrum(st + p * Plane(), spec[p], 0, ed, 0, eh);
    return w_max;
  }

  Tile TileOf(int64_t item) const {
    const int64_t per_image = pl_.tiles_d * pl_.tiles_h * pl_.tiles_w;
    const int64_t t = item % per_image;
    Tile r;
    r.n = item / per_image;
    r.od0 = (t / (pl_.tiles_h * pl_.tiles_w)) * pl_.tile_d;
    r.oh0 = (t / pl_.tiles_w % pl_.tiles_h) * pl_.tile_h;
    r.ow0 = (t % pl_.tiles_w) * pl_.tile_w;
    r.vd = std::min(pl_.tile_d, g_.out_d - r.od0);
    r.vh = std::min(pl_.tile_h, g_.out_h - r.oh0);
    r.vw = std::min(pl_.tile_w, g_.out_w - r.ow0);
    return r;
  }

  // Spectra of the item's input planes j in [j0, j1) (grp = j % groups, ci =
  // ci0 + j / groups) over the tile's window. Window rows and columns outside
  // the (virtual, see in_dilation) input are zero: their row transforms are
  // skipped. Staging checks every value against x_limit_ (a NaN fails too);
  // a window that fails marks its item unsafe, and the item is computed by
  // the direct kernel instead.
  void ForwardItem(int64_t item, int64_t slot, int64_t j0, int64_t j1, int64_t ci0, T* st,
                   C* block_spectra = nullptr) const {
    const Tile t = TileOf(item);
    const int64_t fw = pl_.fft_w, ud = g_.in_dilation_d, uh = g_.in_dilation_h;
    const int64_t uw = g_.in_dilation_w;
    const int64_t need_d = (t.vd - 1) * g_.stride_d + g_.effective_filter_d();
    const int64_t need_h = (t.vh - 1) * g_.stride_h + g_.effective_filter_h();
    const int64_t need_w = (t.vw - 1) * g_.stride_w + g_.effective_filter_w();
    const int64_t id0 = t.od0 * g_.stride_d - g_.pad_front;
    const int64_t ih0 = t.oh0 * g_.stride_h - g_.pad_top;
    const int64_t iw0 = t.ow0 * g_.stride_w - g_.pad_left;
    const int64_t z_lo = std::min(need_d, std::max<int64_t>(0, -id0));
    const int64_t z_hi = std::max(z_lo, std::min(need_d, g_.virtual_in_d() - id0));
    const int64_t r_lo = std::min(need_h, std::max<int64_t>(0, -ih0));
    const int64_t r_hi = std::max(r_lo, std::min(need_h, g_.virtual_in_h() - ih0));
    const int64_t c_lo = std::min(need_w, std::max<int64_t>(0, -iw0));
    const int64_t c_hi = std::max(c_lo, std::min(need_w, g_.virtual_in_w() - iw0));
    const int64_t np = j1 - j0;
    C* spec[kMaxStagePlanes];
    const S* src[kMaxStagePlanes];
    for (int64_t p = 0; p < np; ++p) {
      const int64_t grp = (j0 + p) % g_.groups, ci = ci0 + (j0 + p) / g_.groups;
      spec[p] = block_spectra ? block_spectra + p * bins_ : X(slot, grp, ci);
      src[p] = in_ + t.n * iv_.n + grp * iv_.g + ci * iv_.c;
    }
    if (z_hi == z_lo || r_hi == r_lo || c_hi == c_lo) {  // the window sees only padding
      for (int64_t p = 0; p < np; ++p) std::fill(spec[p], spec[p] + bins_, C(0));
      return;
    }
    const T limit = x_limit_;
    bool safe = true;
    // (At height and depth 1 the window's one row is input row ih0 of slice
    // id0: r_lo and z_lo are 0 here.)
    const bool one_row = OneRow() && uw == 1 && ih0 % uh == 0 && id0 % ud == 0;
    if (one_row) {
      // One row per plane, as long as the input can be: in short column blocks
      // across the block, where the planes' values share cache lines.
      const S* s0[kMaxStagePlanes];
      for (int64_t p = 0; p < np; ++p) {
        T* row = st + p * Plane();
        std::fill(row, row + c_lo, T(0));
        std::fill(row + c_hi, row + fw, T(0));
        s0[p] = src[p] + (id0 / ud) * iv_.d + (ih0 / uh) * iv_.h + (iw0 + c_lo) * iv_.w;
      }
      for (int64_t c0 = 0; c0 < c_hi - c_lo; c0 += kColumnBlock) {
        const int64_t c1 = std::min(c_hi - c_lo, c0 + kColumnBlock);
        for (int64_t p = 0; p < np; ++p)
          safe &= StageColumns(s0[p], iv_.w, c0, c1, st + p * Plane() + c_lo, limit);
      }
    }
    // Slice by slice, row by row across the block: the planes' rows share cache lines.
    for (int64_t z = 0; z < (one_row ? 0 : z_hi - z_lo); ++z) {
      const int64_t vz = id0 + z_lo + z;
      for (int64_t r = 0; r < r_hi - r_lo; ++r) {
        const int64_t vr = ih0 + r_lo + r;
        for (int64_t p = 0; p < np; ++p) {
          T* row = st + p * Plane() + z * Slice() + r * fw;
          std::fill(row, row + fw, T(0));
          if (vr % uh != 0 || vz % ud != 0) continue;
          const S* s = src[p] + (vz / ud) * iv_.d + (vr / uh) * iv_.h;
          if (uw == 1) {
            safe &= StageColumns(s + (iw0 + c_lo) * iv_.w, iv_.w, 0, c_hi - c_lo, row + c_lo, limit);
          } else {
            for (int64_t c = c_lo; c < c_hi; ++c) {
              const int64_t vc = iw0 + c;
              if (vc % uw != 0) continue;
              const T v = Load<T>(s[(vc / uw) * iv_.w]);
              row[c] = v;
              safe &= std::abs(v) <= limit;
            }
          }
        }
      }
    }
    if (!safe) {
      unsafe_[slot].store(true, std::memory_order_relaxed);
      return;  // its spectra are never used
    }
    int64_t step;
    if (OneRow() && EvenlySpaced(spec, np, &step)) {
      fft::RealRowsForward(st, Plane(), np, fw, spec[0], step);
      return;
    }
    for (int64_t p = 0; p < np; ++p)
      ForwardSpectrum(st + p * Plane(), spec[p], z_lo, z_hi, r_lo, r_hi);
  }

  // y[b0, b1) (+)= sum over input channels [ci0, ci0 + nci) of co's group of
  // X * conj(W); the first block overwrites, later blocks accumulate.
  void MixInto(int64_t slot, int64_t co, int64_t b0, int64_t b1, int64_t ci0, int64_t nci,
               C* y) const {
    const int64_t grp = co / g_.out_c_per_group();
    for (int64_t ci = ci0; ci < ci0 + nci; ++ci)
      MulConj(reinterpret_cast<const T*>(X(slot, grp, ci) + b0),
              reinterpret_cast<const T*>(W(co, ci) + b0), reinterpret_cast<T*>(y + b0), b1 - b0,
              ci > 0);
  }

  // All output spectra of a chunk over bins [b0, b0 + kBinBlock): each
  // filter block is read once and stays in L1 across the chunk's items.
  void MixBlock(int64_t n_items, int64_t b0, int64_t ci0, int64_t nci) const {
    const int64_t b1 = std::min(b0 + kBinBlock, bins_);
    for (int64_t co = 0; co < g_.out_c; ++co)
      for (int64_t it = 0; it < n_items; ++it) MixInto(it, co, b0, b1, ci0, nci, Y(it, co));
  }

  // Output channels [co0, co1) of the tile (mixed first if mixing is
  // fused): inverse transforms, keeping only the rows and columns that the
  // stride samples.
  void InverseItem(int64_t item, int64_t slot, int64_t co0, int64_t co1, int worker,
                   bool transformed_here = false) const {
    const Tile t = TileOf(item);
    const int64_t fw = pl_.fft_w, cog = g_.out_c_per_group();
    const T scale = T(1) / (T(pl_.fft_d) * T(pl_.fft_h) * T(fw));
    const int64_t sb = SliceBins();
    T* st = Staging(worker);
    S* dst[kMaxStagePlanes];
    C* spec[kMaxStagePlanes];
    const int64_t np = co1 - co0;
    // Height 1: a fused mix has a spectrum per plane, and the rows go to ducc0 together.
    const bool rows_1d = OneRow();
    for (int64_t co = co0; co < co1; ++co) {
      const int64_t p = co - co0;
      C* y = pl_.fused_mix ? WorkerSpectrum(worker) + (rows_1d ? p * bins_ : 0) : Y(slot, co);
      if (transformed_here) {  // plane-local: the worker's spectrum of this channel's input
        MulConjInPlace(reinterpret_cast<T*>(y), reinterpret_cast<const T*>(W(co, 0)), bins_);
      } else if (pl_.fused_mix) {
        MixInto(slot, co, 0, bins_, 0, g_.in_c_per_group(), y);
      }
      spec[p] = y;
      dst[p] = out_ + t.n * ov_.n + t.od0 * ov_.d + t.oh0 * ov_.h + t.ow0 * ov_.w +
               (co / cog) * ov_.g + (co % cog) * ov_.c;
      if (!rows_1d) {  // the depth transform, then the slices the stride keeps
        fft::ComplexColumns(y, pl_.fft_d, sb, sb, false);
        for (int64_t z = 0; z < t.vd; ++z) {
          C* slice = y + z * g_.stride_d * sb;
          fft::ComplexColumns(slice, pl_.fft_h, bw_, bw_, false);
          fft::RealRowsBackward(slice, g_.stride_h * bw_, t.vh, fw,
                                st + p * Plane() + z * Slice(), fw, scale);
        }
      }
    }
    int64_t step;
    if (rows_1d && EvenlySpaced(spec, np, &step)) {
      fft::RealRowsBackward(spec[0], step, np, fw, st, Plane(), scale);
    } else if (rows_1d) {
      for (int64_t p = 0; p < np; ++p)
        fft::RealRowsBackward(spec[p], bw_, 1, fw, st + p * Plane(), fw, scale);
    }
    if (rows_1d) {  // one long row per plane: across the block in short column blocks
      for (int64_t c0 = 0; c0 < t.vw; c0 += kColumnBlock)
        for (int64_t p = 0; p < np; ++p)
          for (int64_t c = c0; c < std::min(t.vw, c0 + kColumnBlock); ++c)
            dst[p][c * ov_.w] = Store<S, T>(st[p * Plane() + c * g_.stride_w]);
      return;
    }
    // Row by row across the block: the channels' pixels share cache lines.
    for (int64_t z = 0; z < t.vd; ++z)
      for (int64_t r = 0; r < t.vh; ++r)
        for (int64_t p = 0; p < np; ++p) {
          const T* row = st + p * Plane() + z * Slice() + r * fw;
          S* d = dst[p] + z * ov_.d + r * ov_.h;
          for (int64_t c = 0; c < t.vw; ++c) d[c * ov_.w] = Store<S, T>(row[c * g_.stride_w]);
        }
  }

  // ---- Lane plans (LaneFftPlan): groups of kFftLanes adjacent groups,
  // staged position-major as the backend's vectors (LaneKit). A task stages
  // LaneGroupsPerTask groups together, reading whole lines of an NWC row,
  // then transforms, mixes and inverts one group at a time in L2.

  void RunLanes(const ParallelFor& pf) {
    kit_ = std::make_unique<LaneKit<S, T>>(pl_.fft_w);
    // A backend the plan's buffers do not serve gets the direct kernel, never an overrun.
    if (!kit_->Fits()) return DirectConv(Direct(params_.problem), pf, ActiveIsa());
    const int64_t lane_groups = CeilDiv(g_.groups, kFftLanes);
    const int64_t tasks_per_item = CeilDiv(lane_groups, LaneGroupsPerTask(pl_));
    const bool sums = g_.in_c_per_group() > 1;
    for (int64_t i = 0; i < pl_.items; ++i) unsafe_[i].store(false, std::memory_order_relaxed);
    if (!sums) {  // the filter's lane spectra, once for all items
      filter_max_.store(0, std::memory_order_relaxed);
      pf(lane_groups, [&](int64_t b, int64_t e, int worker) {
        T most = 0;
        for (int64_t lg = b; lg < e; ++lg) {
          bool finite = true;
          T* w = FilterLanes(lg);
          most = std::max(most, StageTapLanes(0, lg * kFftLanes,
                                              std::min(g_.groups, (lg + 1) * kFftLanes), &w, &finite));
          if (!finite) most = std::numeric_limits<T>::infinity();
          kit_->Transform(w, LaneScratch(worker), true);
        }
        RaiseFilterMax(most);
      });
      const T w_max = filter_max_.load(std::memory_order_relaxed);
      if (!(w_max <= std::numeric_limits<T>::max()))  // as in Run: tf.nn.conv2d's NaN placement
        return DirectConv(Direct(params_.problem), pf, ActiveIsa());
      x_limit_ = InputLimit(w_max);
    }
    // Tasks go group set by group set, the items within each, so that a
    // worker's filter spectra stay in cache across the items.
    const int64_t items = pl_.items;
    pf(items * tasks_per_item, [&](int64_t b, int64_t e, int worker) {
      for (int64_t i = b; i < e; ++i) {
        if (sums) LaneSumTask(i % items, i / items, worker);
        else LaneTask(i % items, i / items, worker);
      }
    });
    // Tiles whose window holds a NaN, an Inf or a value the transforms
    // could overflow with: the direct kernel, as in Run.
    for (int64_t item = 0; item < items; ++item)
      if (unsafe_[item].load(std::memory_order_relaxed)) DirectTile(item, pf);
  }

  // One input channel per group: the task's groups of the item, each
  // transformed, multiplied by its filter spectra and inverted in place.
  void LaneTask(int64_t item, int64_t task, int worker) const {
    const Tile t = TileOf(item);
    const int64_t per_task = LaneGroupsPerTask(pl_), l0 = task * per_task * kFftLanes;
    const int64_t l1 = std::min(g_.groups, l0 + per_task * kFftLanes);
    const int64_t ng = CeilDiv(l1 - l0, kFftLanes);
    T* bufs[kMaxLaneGroupsPerTask];
    for (int64_t q = 0; q < ng; ++q) bufs[q] = LaneBuffer(worker, q);
    bool finite = true;
    const T most = StageInputLanes(t, 0, l0, l1, bufs, &finite);
    if (!finite || !(most <= x_limit_)) {
      unsafe_[item].store(true, std::memory_order_relaxed);
      return;
    }
    T* scratch = LaneScratch(worker);
    for (int64_t q = 0; q < ng; ++q) {
      kit_->Transform(bufs[q], scratch, true);
      kit_->Mul(bufs[q], FilterLanes(l0 / kFftLanes + q), bufs[q], /*conj=*/true, false);
      kit_->Transform(bufs[q], scratch, false);
    }
    WriteLanes(t, l0, l1, bufs);
  }

  // Several input channels per group (one item): the task sums each
  // group's products over them, transforming input and filter as it goes.
  void LaneSumTask(int64_t item, int64_t task, int worker) const {
    const Tile t = TileOf(item);
    const int64_t per_task = LaneGroupsPerTask(pl_), l0 = task * per_task * kFftLanes;
    const int64_t l1 = std::min(g_.groups, l0 + per_task * kFftLanes);
    const int64_t ng = CeilDiv(l1 - l0, kFftLanes);
    T *x[kMaxLaneGroupsPerTask], *w[kMaxLaneGroupsPerTask], *sum[kMaxLaneGroupsPerTask];
    for (int64_t q = 0; q < ng; ++q) {
      x[q] = LaneBuffer(worker, q);
      w[q] = LaneBuffer(worker, per_task + q);
      sum[q] = LaneBuffer(worker, 2 * per_task + q);
    }
    T* scratch = LaneScratch(worker);
    T x_most = 0, w_most = 0;
    bool finite = true;
    for (int64_t ci = 0; ci < g_.in_c_per_group() && finite; ++ci) {
      x_most = std::max(x_most, StageInputLanes(t, ci, l0, l1, x, &finite));
      w_most = std::max(w_most, StageTapLanes(ci, l0, l1, w, &finite));
      for (int64_t q = 0; q < ng && finite; ++q) {
        kit_->Transform(x[q], scratch, true);
        kit_->Transform(w[q], scratch, true);
        kit_->Mul(x[q], w[q], sum[q], /*conj=*/true, ci > 0);
      }
    }
    if (!finite || !(x_most <= InputLimit(w_most))) {
      unsafe_[item].store(true, std::memory_order_relaxed);
      return;
    }
    for (int64_t q = 0; q < ng; ++q) kit_->Transform(sum[q], scratch, false);
    WriteLanes(t, l0, l1, sum);
  }

  // Input channel ci of groups [l0, l1) over the tile's window (as in
  // ForwardItem: positions outside the virtual input are zero).
  T StageInputLanes(const Tile& t, int64_t ci, int64_t l0, int64_t l1, T* const* bufs,
                    bool* finite) const {
    const int64_t uw = g_.in_dilation_w, uh = g_.in_dilation_h, ud = g_.in_dilation_d;
    const int64_t need_w = (t.vw - 1) * g_.stride_w + g_.effective_filter_w();
    const int64_t iw0 = t.ow0 * g_.stride_w - g_.pad_left;
    const int64_t ih0 = t.oh0 * g_.stride_h - g_.pad_top;
    const int64_t id0 = t.od0 * g_.stride_d - g_.pad_front;
    const int64_t c_lo = std::min(need_w, std::max<int64_t>(0, -iw0));
    const int64_t c_hi = std::max(c_lo, std::min(need_w, g_.virtual_in_w() - iw0));
    // The window's one row (height and depth 1): input row ih0 of slice id0, if any.
    const bool row = ih0 >= 0 && ih0 < g_.virtual_in_h() && ih0 % uh == 0 && id0 >= 0 &&
                     id0 < g_.virtual_in_d() && id0 % ud == 0;
    // Input columns i whose positions i * uw - iw0 fall in [c_lo, c_hi).
    const int64_t i_lo = CeilDiv(iw0 + c_lo, uw), i_hi = CeilDiv(iw0 + c_hi, uw);
    const int64_t count = row ? std::max<int64_t>(0, i_hi - i_lo) : 0;
    const S* base = in_ + t.n * iv_.n + ci * iv_.c + l0 * iv_.g + (id0 / ud) * iv_.d +
                    (ih0 / uh) * iv_.h + i_lo * iv_.w;
    return kit_->Stage(base, iv_.g, l1 - l0, bufs, i_lo * uw - iw0, count, iv_.w, uw, finite);
  }

  // Filter taps of input channel ci for groups [l0, l1), placed at the origin.
  T StageTapLanes(int64_t ci, int64_t l0, int64_t l1, T* const* bufs, bool* finite) const {
    const S* base = filt_ + fv_.offset + ci * fv_.i + l0 * fv_.g;
    return kit_->Stage(base, fv_.g, l1 - l0, bufs, 0, g_.filter_w, fv_.w, g_.dilation_w, finite);
  }

  // The tile's outputs of groups [l0, l1) from their inverted buffers,
  // keeping the positions the stride samples.
  void WriteLanes(const Tile& t, int64_t l0, int64_t l1, T* const* bufs) const {
    S* base = out_ + t.n * ov_.n + t.od0 * ov_.d + t.oh0 * ov_.h + t.ow0 * ov_.w + l0 * ov_.g;
    kit_->Write(bufs, l1 - l0, 0, t.vw, g_.stride_w, base, ov_.g, ov_.w);
  }

  // The worker's group buffer b (LaneWorkerBuffers: the task's, then scratch).
  T* LaneBuffer(int worker, int64_t b) const {
    return AlignLanes<T>(Worker(worker)) + b * kit_->GroupValues();
  }
  T* LaneScratch(int worker) const { return LaneBuffer(worker, LaneWorkerBuffers(g_, pl_) - 2); }
  // The filter's lane spectra of group lg (one input channel per group).
  T* FilterLanes(int64_t lg) const {
    return AlignLanes<T>(reinterpret_cast<char*>(wspec_)) + lg * kit_->GroupValues();
  }

  const FftParams params_;
  const ConvGeometry g_;
  const FftPlan pl_;
  const S* in_;
  const S* filt_;
  S* out_;
  const TensorView iv_, ov_;
  const FilterView fv_;
  const int64_t bw_, bins_;
  C* wspec_;
  C* items_;
  char* workers_;
  // Per chunk slot: the item's window failed the staging check.
  std::unique_ptr<std::atomic<bool>[]> unsafe_;
  // Lane plans: the transforms and their group buffers' layout.
  std::unique_ptr<LaneKit<S, T>> kit_;
  // The current filter block's largest magnitude, and the input limit it allows.
  std::atomic<T> filter_max_{0};
  T x_limit_ = 0;
};

// FftLaneBackprop (LaneBackpropPlan): a task holds its groups' filter
// spectra, and image by image transforms dL/doutput and the input once each.
template <typename S, typename T>
class LaneBackprop {
 public:
  explicit LaneBackprop(const LaneBackpropParams& p)
      : p_(p),
        g_(p.problem.g),
        kit_(p.plan.fft_w),
        x_(static_cast<const S*>(p.input)),
        w_(static_cast<const S*>(p.filter)),
        dy_(static_cast<const S*>(p.out_backprop)),
        dx_(static_cast<S*>(p.input_backprop)),
        dw_(static_cast<S*>(p.filter_backprop)),
        xv_(p.problem.in),
        yv_(p.problem.out),
        fv_(p.problem.filter) {}

  void Run(const ParallelFor& pf) {
    if (!kit_.Fits()) return Separately(pf);
    const int64_t tasks = CeilDiv(CeilDiv(g_.groups, kFftLanes), PerTask());
    std::atomic<bool> unsafe{false};
    pf(tasks, [&](int64_t b, int64_t e, int worker) {
      for (int64_t t = b; t < e; ++t)
        if (!Task(t, worker)) unsafe.store(true, std::memory_order_relaxed);
    });
    if (unsafe.load(std::memory_order_relaxed)) Separately(pf);
  }

 private:
  int64_t PerTask() const { return p_.plan.stage_planes / kFftLanes; }
  T* Buffer(int worker, int64_t b) const {
    return AlignLanes<T>(static_cast<char*>(p_.workspace) + int64_t(worker) * p_.plan.worker_bytes) +
           b * kit_.GroupValues();
  }

  // Channels [l0, l1): false if a value was not finite or could overflow.
  bool Task(int64_t task, int worker) const {
    const int64_t per = PerTask(), l0 = task * per * kFftLanes;
    const int64_t l1 = std::min(g_.groups, l0 + per * kFftLanes), nl = l1 - l0;
    const int64_t ng = CeilDiv(nl, kFftLanes);
    T *w[kMaxLaneGroupsPerTask], *dy[kMaxLaneGroupsPerTask], *x[kMaxLaneGroupsPerTask],
        *sum[kMaxLaneGroupsPerTask];
    for (int64_t q = 0; q < ng; ++q) {
      w[q] = Buffer(worker, q);
      dy[q] = Buffer(worker, per + q);
      x[q] = Buffer(worker, 2 * per + q);
      sum[q] = Buffer(worker, 3 * per + q);
    }
    T* scratch = Buffer(worker, 4 * per);
    bool finite = true;
    const T w_most = kit_.Stage(w_ + fv_.offset + l0 * fv_.g, fv_.g, nl, w, 0, g_.filter_w,
                                fv_.w, g_.dilation_w, &finite);
    if (!finite) return false;
    for (int64_t q = 0; q < ng; ++q) kit_.Transform(w[q], scratch, true);
    T x_most = 0, dy_most = 0;
    for (int64_t n = 0; n < g_.batch; ++n) {
      // dL/doutput at the output positions times the stride, the input after the left padding.
      dy_most = std::max(dy_most, kit_.Stage(dy_ + n * yv_.n + l0 * yv_.g, yv_.g, nl, dy, 0,
                                             g_.out_w, yv_.w, g_.stride_w, &finite));
      x_most = std::max(x_most, kit_.Stage(x_ + n * xv_.n + l0 * xv_.g, xv_.g, nl, x, g_.pad_left,
                                           g_.in_w, xv_.w, 1, &finite));
      if (!finite) return false;
      for (int64_t q = 0; q < ng; ++q) {
        kit_.Transform(dy[q], scratch, true);
        kit_.Transform(x[q], scratch, true);
        kit_.MulBackprop(x[q], dy[q], w[q], sum[q], n > 0);
        kit_.Transform(dy[q], scratch, false);
      }
      kit_.Write(dy, nl, g_.pad_left, g_.in_w, 1, dx_ + n * xv_.n + l0 * xv_.g, xv_.g, xv_.w);
    }
    // dL/dx: dL/dy against the filter; dL/dw: the input against dL/dy, summed over the batch.
    const double points = double(p_.plan.fft_w);
    if (!(dy_most <= FftInputLimit(points, 1.0, double(g_.filter_w), w_most)) ||
        !(x_most <= FftInputLimit(points, double(g_.batch), double(g_.out_w), dy_most)))
      return false;
    for (int64_t q = 0; q < ng; ++q) kit_.Transform(sum[q], scratch, false);
    kit_.Write(sum, nl, 0, g_.filter_w, g_.dilation_w, dw_ + fv_.offset + l0 * fv_.g, fv_.g,
               fv_.w);
    return true;
  }

  // Each gradient as its own problem with the direct kernel, which places
  // NaNs and Infs as TensorFlow's kernels do.
  void Separately(const ParallelFor& pf) const {
    const auto direct = [&](const ConvProblem& problem, const void* a, const void* b, void* out) {
      DirectParams d;
      d.problem = problem;
      d.dtype = p_.dtype;
      d.input = a;
      d.filter = b;
      d.output = out;
      DirectConv(d, pf, ActiveIsa());
    };
    direct(BackpropInputProblem(g_), p_.out_backprop, p_.filter, p_.input_backprop);
    direct(BackpropFilterProblem(g_), p_.input, p_.out_backprop, p_.filter_backprop);
  }

  const LaneBackpropParams p_;
  const ConvGeometry g_;
  const LaneKit<S, T> kit_;
  const S *x_, *w_, *dy_;
  S *dx_, *dw_;
  const TensorView xv_, yv_;
  const FilterView fv_;
};

}  // namespace

void FftLaneBackprop(const LaneBackpropParams& p, const ParallelFor& pf) {
  const ConvGeometry& g = p.problem.g;
  if (g.output_elements() == 0 || g.empty_sums()) {  // zeros, as the separate passes give
    ZeroConvOutput(BackpropInputProblem(g), p.dtype, p.input_backprop);
    ZeroConvOutput(BackpropFilterProblem(g), p.dtype, p.filter_backprop);
    return;
  }
  switch (p.dtype) {
    case DType::kFloat: return LaneBackprop<float, float>(p).Run(pf);
    case DType::kDouble: return LaneBackprop<double, double>(p).Run(pf);
    case DType::kHalf: return LaneBackprop<f16, float>(p).Run(pf);
    case DType::kBFloat16: return LaneBackprop<bf16, float>(p).Run(pf);
  }
}

void FftConv(const FftParams& p, const ParallelFor& pf) {
  const ConvGeometry& g = p.problem.g;
  if (g.output_elements() == 0) return;
  if (g.empty_sums()) return ZeroConvOutput(p.problem, p.dtype, p.output);
  switch (p.dtype) {
    case DType::kFloat: return FftRunner<float, float>(p).Run(pf);
    case DType::kDouble: return FftRunner<double, double>(p).Run(pf);
    case DType::kHalf: return FftRunner<f16, float>(p).Run(pf);
    case DType::kBFloat16: return FftRunner<bf16, float>(p).Run(pf);
  }
}

}  // namespace tfbigconv
