// The fused 1-D backward (FftLaneBackprop, LaneBackpropPlan): both gradients
// of a long depthwise 1-D convolution from one transform of dL/doutput per
// image, in a module of its own as FlashFFTConv keeps its long 1-D kernel.
#include <algorithm>
#include <atomic>

#include "checked_math.h"
#include "direct_cpu.h"
#include "fft_cpu.h"
#include "fft_cpu_kit.h"
#include "isa.h"

namespace tfbigconv {
namespace {
using namespace fft_cpu_internal;

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
    const T w_most = kit_.Stage(w_ + fv_.offset + l0 * fv_.g, fv_.g, nl, w, 0, g_.filter[kW],
                                fv_.w, g_.dilation[kW], &finite);
    if (!finite) return false;
    for (int64_t q = 0; q < ng; ++q) kit_.Transform(w[q], scratch, true);
    T x_most = 0, dy_most = 0;
    for (int64_t n = 0; n < g_.batch; ++n) {
      // dL/doutput at the output positions times the stride, the input after the left padding.
      dy_most = std::max(dy_most, kit_.Stage(dy_ + n * yv_.n + l0 * yv_.g, yv_.g, nl, dy, 0,
                                             g_.out[kW], yv_.w, g_.stride[kW], &finite));
      x_most = std::max(x_most, kit_.Stage(x_ + n * xv_.n + l0 * xv_.g, xv_.g, nl, x,
                                           g_.pad_before[kW], g_.in[kW], xv_.w, 1, &finite));
      if (!finite) return false;
      for (int64_t q = 0; q < ng; ++q) {
        kit_.Transform(dy[q], scratch, true);
        kit_.Transform(x[q], scratch, true);
        kit_.MulBackprop(x[q], dy[q], w[q], sum[q], n > 0);
        kit_.Transform(dy[q], scratch, false);
      }
      kit_.Write(dy, nl, g_.pad_before[kW], g_.in[kW], 1, dx_ + n * xv_.n + l0 * xv_.g, xv_.g,
                 xv_.w);
    }
    // dL/dx: dL/dy against the filter; dL/dw: the input against dL/dy, summed over the batch.
    const double points = double(p_.plan.fft_w);
    if (!(dy_most <= FftInputLimit(points, 1.0, double(g_.filter[kW]), w_most)) ||
        !(x_most <= FftInputLimit(points, double(g_.batch), double(g_.out[kW]), dy_most)))
      return false;
    for (int64_t q = 0; q < ng; ++q) kit_.Transform(sum[q], scratch, false);
    kit_.Write(sum, nl, 0, g_.filter[kW], g_.dilation[kW], dw_ + fv_.offset + l0 * fv_.g, fv_.g,
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

}  // namespace tfbigconv
