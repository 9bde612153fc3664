// Lane plans (LaneFftPlan, fft_plan.h): FftConv's runner for 1-D
// convolutions with one output channel per group, kFftLanes adjacent groups
// transformed together as the backend's vectors.
#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>

#include "fft_cpu_runner.h"

namespace tfbigconv {
namespace fft_cpu_internal {
namespace {

// Groups of kFftLanes adjacent groups, staged position-major as the
// backend's vectors (LaneKit). A task stages LaneGroupsPerTask groups
// together, reading whole lines of an NWC row, then transforms, mixes and
// inverts one group at a time in L2.
template <typename S, typename T>
class LaneRunner : public FftRunnerBase<S, T> {
  using Base = FftRunnerBase<S, T>;
  using Base::params_, Base::g_, Base::pl_, Base::in_, Base::filt_, Base::out_, Base::iv_,
      Base::ov_, Base::fv_, Base::wspec_, Base::unsafe_, Base::filter_max_, Base::x_limit_;
  using Base::InputLimit, Base::RaiseFilterMax, Base::Direct, Base::DirectTile, Base::Worker,
      Base::TileOf;

 public:
  explicit LaneRunner(const FftParams& p) : Base(p) {}

  void Run(const ParallelFor& pf) {
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
    const int64_t uw = g_.in_dilation[kW], uh = g_.in_dilation[kH], ud = g_.in_dilation[kD];
    const int64_t need_w = (t.vw - 1) * g_.stride[kW] + g_.effective_filter(kW);
    const int64_t iw0 = t.ow0 * g_.stride[kW] - g_.pad_before[kW];
    const int64_t ih0 = t.oh0 * g_.stride[kH] - g_.pad_before[kH];
    const int64_t id0 = t.od0 * g_.stride[kD] - g_.pad_before[kD];
    const int64_t c_lo = std::min(need_w, std::max<int64_t>(0, -iw0));
    const int64_t c_hi = std::max(c_lo, std::min(need_w, g_.virtual_in(kW) - iw0));
    // The window's one row (height and depth 1): input row ih0 of slice id0, if any.
    const bool row = ih0 >= 0 && ih0 < g_.virtual_in(kH) && ih0 % uh == 0 && id0 >= 0 &&
                     id0 < g_.virtual_in(kD) && id0 % ud == 0;
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
    return kit_->Stage(base, fv_.g, l1 - l0, bufs, 0, g_.filter[kW], fv_.w, g_.dilation[kW],
                       finite);
  }

  // The tile's outputs of groups [l0, l1) from their inverted buffers,
  // keeping the positions the stride samples.
  void WriteLanes(const Tile& t, int64_t l0, int64_t l1, T* const* bufs) const {
    S* base = out_ + t.n * ov_.n + t.od0 * ov_.d + t.oh0 * ov_.h + t.ow0 * ov_.w + l0 * ov_.g;
    kit_->Write(bufs, l1 - l0, 0, t.vw, g_.stride[kW], base, ov_.g, ov_.w);
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

 private:
  // Lane plans: the transforms and their group buffers' layout.
  std::unique_ptr<LaneKit<S, T>> kit_;
};

}  // namespace

void FftLaneConv(const FftParams& p, const ParallelFor& pf) {
  switch (p.dtype) {
    case DType::kFloat: return LaneRunner<float, float>(p).Run(pf);
    case DType::kDouble: return LaneRunner<double, double>(p).Run(pf);
    case DType::kHalf: return LaneRunner<f16, float>(p).Run(pf);
    case DType::kBFloat16: return LaneRunner<bf16, float>(p).Run(pf);
  }
}

}  // namespace fft_cpu_internal
}  // namespace tfbigconv
