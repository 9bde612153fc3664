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
#include "fft_cpu_runner.h"
#include "isa.h"

namespace tfbigconv {
namespace {
using namespace fft_cpu_internal;

// The 2-D and 3-D plans' runner (and 1-D plans too narrow for lanes): chunks
// of items, each transformed, mixed with the filter spectra and inverted.
template <typename S, typename T>
class FftRunner : public FftRunnerBase<S, T> {
  using Base = FftRunnerBase<S, T>;
  using typename Base::C;
  using Base::params_, Base::g_, Base::pl_, Base::in_, Base::filt_, Base::out_, Base::iv_,
      Base::ov_, Base::fv_, Base::bw_, Base::bins_, Base::wspec_, Base::items_, Base::unsafe_,
      Base::filter_max_, Base::x_limit_;
  using Base::InputLimit, Base::RaiseFilterMax, Base::Direct, Base::DirectTile, Base::Worker,
      Base::Staging, Base::Plane, Base::Slice, Base::TileOf;

 public:
  explicit FftRunner(const FftParams& p) : Base(p) {}

  void Run(const ParallelFor& pf) {
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

  // The spectrum of a staged plane (ForwardPlaneSpectrum).
  void ForwardSpectrum(const T* st, C* spec, int64_t z0, int64_t z1, int64_t r0, int64_t r1) const {
    ForwardPlaneSpectrum(pl_, st, spec, z0, z1, r0, r1);
  }

  // Spectra of the dilated filter tap planes i in [i0, i1) of the block
  // starting at input channel ci0 (co = i % out_c, ci = ci0 + i / out_c, ci
  // within its group), placed at the origin. Returns their largest magnitude
  // (NaN or Inf if one holds one), found while staging them.
  T FilterSpectra(int64_t i0, int64_t i1, int64_t ci0, T* st) const {
    const int64_t ed = g_.effective_filter(kD), eh = g_.effective_filter(kH), fw = pl_.fft_w;
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
      for (int64_t k0 = 0; k0 < g_.filter[kW]; k0 += kColumnBlock) {
        const int64_t k1 = std::min(g_.filter[kW], k0 + kColumnBlock);
        for (int64_t p = 0; p < np; ++p)
          w_max = std::max(w_max, StageTaps(f[p], fv_.w, k0, k1, st + p * Plane(),
                                            g_.dilation[kW], &finite));
      }
    } else {
      for (int64_t kd = 0; kd < g_.filter[kD]; ++kd)
        for (int64_t kh = 0; kh < g_.filter[kH]; ++kh)
          for (int64_t p = 0; p < np; ++p)
            w_max = std::max(w_max, StageTaps(f[p] + kd * fv_.d + kh * fv_.h, fv_.w, 0,
                                              g_.filter[kW],
                                              st + p * Plane() + kd * g_.dilation[kD] * Slice() +
                                                  kh * g_.dilation[kH] * fw,
                                              g_.dilation[kW], &finite));
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


  // Spectra of the item's input planes j in [j0, j1) (grp = j % groups, ci =
  // ci0 + j / groups) over the tile's window. Window rows and columns outside
  // the (virtual, see in_dilation) input are zero: their row transforms are
  // skipped. Staging checks every value against x_limit_ (a NaN fails too);
  // a window that fails marks its item unsafe, and the item is computed by
  // the direct kernel instead.
  void ForwardItem(int64_t item, int64_t slot, int64_t j0, int64_t j1, int64_t ci0, T* st,
                   C* block_spectra = nullptr) const {
    const Tile t = TileOf(item);
    const int64_t fw = pl_.fft_w, ud = g_.in_dilation[kD], uh = g_.in_dilation[kH];
    const int64_t uw = g_.in_dilation[kW];
    const Window win = WindowOf(g_, t);
    const int64_t id0 = win.d0, ih0 = win.h0, iw0 = win.w0;
    const int64_t z_lo = win.z_lo, z_hi = win.z_hi, r_lo = win.r_lo, r_hi = win.r_hi;
    const int64_t c_lo = win.c_lo, c_hi = win.c_hi;
    const int64_t np = j1 - j0;
    C* spec[kMaxStagePlanes];
    const S* src[kMaxStagePlanes];
    for (int64_t p = 0; p < np; ++p) {
      const int64_t grp = (j0 + p) % g_.groups, ci = ci0 + (j0 + p) / g_.groups;
      spec[p] = block_spectra ? block_spectra + p * bins_ : X(slot, grp, ci);
      src[p] = in_ + t.n * iv_.n + grp * iv_.g + ci * iv_.c;
    }
    if (win.only_padding()) {
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
      if (!rows_1d) InversePlaneSpectrum(g_, pl_, t, y, st + p * Plane(), scale);
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
            dst[p][c * ov_.w] = Store<S, T>(st[p * Plane() + c * g_.stride[kW]]);
      return;
    }
    // Row by row across the block: the channels' pixels share cache lines.
    for (int64_t z = 0; z < t.vd; ++z)
      for (int64_t r = 0; r < t.vh; ++r)
        for (int64_t p = 0; p < np; ++p) {
          const T* row = st + p * Plane() + z * Slice() + r * fw;
          S* d = dst[p] + z * ov_.d + r * ov_.h;
          for (int64_t c = 0; c < t.vw; ++c) d[c * ov_.w] = Store<S, T>(row[c * g_.stride[kW]]);
        }
  }
};

}  // namespace

void FftConv(const FftParams& p, const ParallelFor& pf) {
  const ConvGeometry& g = p.problem.g;
  if (g.output_elements() == 0) return;
  if (g.empty_sums()) return ZeroConvOutput(p.problem, p.dtype, p.output);
  if (p.plan.lanes) return FftLaneConv(p, pf);
  switch (p.dtype) {
    case DType::kFloat: return FftRunner<float, float>(p).Run(pf);
    case DType::kDouble: return FftRunner<double, double>(p).Run(pf);
    case DType::kHalf: return FftRunner<f16, float>(p).Run(pf);
    case DType::kBFloat16: return FftRunner<bf16, float>(p).Run(pf);
  }
}

}  // namespace tfbigconv
