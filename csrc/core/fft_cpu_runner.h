// What the CPU FFT runners share (fft_cpu.cc's FftRunner for the 2-D and
// 3-D plans, fft_cpu_lanes.cc's LaneRunner for lane plans): the operands, the
// workspace's layout, an item's tile, and the direct kernel for the tiles the
// transforms cannot take. Internal to the core.
#pragma once

#include <algorithm>
#include <atomic>
#include <complex>
#include <memory>

#include "checked_math.h"
#include "direct_cpu.h"
#include "fft_cpu.h"
#include "fft_cpu_kit.h"
#include "isa.h"

namespace tfbigconv {
namespace fft_cpu_internal {

template <typename S, typename T>
class FftRunnerBase {
 public:
  explicit FftRunnerBase(const FftParams& p)
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

 protected:
  using C = std::complex<T>;

  // The largest input magnitude this plan's transforms take safely with
  // filter values up to w_max (FftInputLimit).
  T InputLimit(T w_max) const {
    const double taps = double(g_.filter[kD]) * double(g_.filter[kH]) * double(g_.filter[kW]);
    return FftInputLimit(double(Plane()), double(g_.in_c_per_group()), taps, w_max);
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
    const int64_t first[kSpatialAxes] = {t.od0, t.oh0, t.ow0};
    const int64_t extent[kSpatialAxes] = {t.vd, t.vh, t.vw};
    for (int a = 0; a < kSpatialAxes; ++a) {
      g.out[a] = extent[a];
      g.pad_before[a] -= first[a] * g.stride[a];  // may turn negative: cropping
      g.pad_after[a] = (extent[a] - 1) * g.stride[a] + g.effective_filter(a) - g.virtual_in(a) -
                       g.pad_before[a];
    }
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

  Tile TileOf(int64_t item) const { return TileOfItem(g_, pl_, item); }

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
  // The current filter block's largest magnitude, and the input limit it allows.
  std::atomic<T> filter_max_{0};
  T x_limit_ = 0;
};

// FftConv for a lane plan (FftPlan::lanes): fft_cpu_lanes.cc.
void FftLaneConv(const FftParams& p, const ParallelFor& pf);

}  // namespace fft_cpu_internal
}  // namespace tfbigconv
