#include "fft_cpu_floor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <memory>
#include <vector>

#include "checked_math.h"
#include "fft_cpu_kit.h"

namespace tfbigconv {
namespace {
using namespace fft_cpu_internal;

double RealFlops(int64_t n) { return n > 1 ? 2.5 * double(n) * std::log2(double(n)) : 0.0; }
double ComplexFlops(int64_t n) { return 2.0 * RealFlops(n); }

// Per-worker buffers of `values` T each, 64-byte aligned, filled (and so
// resident) before the clock starts.
template <typename T>
class WorkerBuffers {
 public:
  WorkerBuffers(int workers, int64_t values)
      : stride_((values + 15) / 16 * 16), data_(size_t(workers) * stride_ + 16) {
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = T(int64_t(i % 17) - 8) / T(16);
  }
  T* Of(int worker) const {
    return AlignLanes<T>(reinterpret_cast<char*>(const_cast<T*>(data_.data()))) +
           int64_t(worker) * stride_;
  }

 private:
  int64_t stride_;
  std::vector<T> data_;
};

double Timed(const ParallelFor& pf, int64_t tasks, const ParallelFor::Body& body) {
  const auto t0 = std::chrono::steady_clock::now();
  pf(tasks, body);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 2-D and 3-D plans (and 1-D plans too narrow for lanes, one plane at a time).
template <typename T>
FftFloorTiming PlaneFloor(const ConvGeometry& g, const FftPlan& p, FloorFilter filter,
                          const ParallelFor& pf) {
  using C = std::complex<T>;
  const int64_t plane = p.fft_d * p.fft_h * p.fft_w, bins = p.bins();
  // A real plane, then a spectrum, per worker.
  WorkerBuffers<T> buf(pf.num_workers(), plane + 2 * bins + 16);
  const int64_t in_planes = g.in_c, out_planes = g.out_c;
  const int64_t filt = filter == FloorFilter::kData ? g.out_c * g.in_c_per_group() : 0;
  const int64_t items = p.items, per_item = in_planes + out_planes;
  const T scale = T(1) / T(plane);
  const auto spectrum = [&](int worker) {
    return reinterpret_cast<C*>(AlignLanes<T>(reinterpret_cast<char*>(buf.Of(worker) + plane)));
  };
  // Flops of a forward transform of z slices of r rows, and of an inverse keeping t's.
  const int64_t bw = p.bins_w();
  const auto fwd_flops = [&](int64_t z, int64_t r) {
    return z > 0 && r > 0 ? double(z) * (double(r) * RealFlops(p.fft_w) + bw * ComplexFlops(p.fft_h)) +
                                double(p.fft_h * bw) * ComplexFlops(p.fft_d)
                          : 0.0;
  };
  const auto inv_flops = [&](const Tile& t) {
    return double(p.fft_h * bw) * ComplexFlops(p.fft_d) +
           double(t.vd) * (bw * ComplexFlops(p.fft_h) + double(t.vh) * RealFlops(p.fft_w));
  };
  FftFloorTiming r;
  const int64_t ed = g.effective_filter(kD), eh = g.effective_filter(kH);
  r.flops = double(filt) * fwd_flops(ed, eh);
  r.transforms = filt;
  for (int64_t item = 0; item < items; ++item) {
    const Tile t = TileOfItem(g, p, item);
    const Window win = WindowOf(g, t);
    if (!win.only_padding()) {
      r.flops += double(in_planes) * fwd_flops(win.z_hi - win.z_lo, win.r_hi - win.r_lo);
      r.transforms += in_planes;
    }
    r.flops += double(out_planes) * inv_flops(t);
    r.transforms += out_planes;
  }
  r.seconds = Timed(pf, filt + items * per_item, [&](int64_t b, int64_t e, int worker) {
    T* st = buf.Of(worker);
    C* spec = spectrum(worker);
    for (int64_t i = b; i < e; ++i) {
      if (i < filt) {
        ForwardPlaneSpectrum(p, st, spec, 0, ed, 0, eh);
        continue;
      }
      const int64_t item = (i - filt) / per_item, k = (i - filt) % per_item;
      const Tile t = TileOfItem(g, p, item);
      if (k < in_planes) {
        const Window win = WindowOf(g, t);
        if (!win.only_padding())
          ForwardPlaneSpectrum(p, st, spec, win.z_lo, win.z_hi, win.r_lo, win.r_hi);
      } else if (p.fft_h == 1 && p.fft_d == 1) {
        fft::RealRowsBackward(spec, p.bins_w(), 1, p.fft_w, st, p.fft_w, scale);
      } else {
        InversePlaneSpectrum(g, p, t, spec, st, scale);
      }
    }
  });
  return r;
}

// Lane plans: a lane group's transforms on a worker's group buffer.
template <typename T>
FftFloorTiming LaneFloor(const ConvGeometry& g, const FftPlan& p, FloorFilter filter,
                         const ParallelFor& pf) {
  const LaneKit<T, T> kit(p.fft_w);
  FftFloorTiming r;
  if (!kit.Fits()) return r;
  const int64_t lane_groups = CeilDiv(g.groups, kFftLanes), cig = g.in_c_per_group();
  // Summing plans transform input (and, as data, the filter) per channel, then invert the sum.
  const int64_t forward = cig * (cig > 1 && filter == FloorFilter::kData ? 2 : 1);
  const int64_t scratch = 2 * kit.GroupValues();  // what Fits() allows ducc0
  WorkerBuffers<T> buf(pf.num_workers(), kit.GroupValues() + scratch + 16);
  const int64_t per_group = forward + 1;
  r.transforms = p.items * lane_groups * per_group;
  r.flops = double(r.transforms) * double(kFftLanes) * RealFlops(p.fft_w);
  r.seconds = Timed(pf, p.items * lane_groups * per_group, [&](int64_t b, int64_t e, int worker) {
    T* data = buf.Of(worker);
    T* sc = data + (kit.GroupValues() + 15) / 16 * 16;
    for (int64_t i = b; i < e; ++i) kit.Transform(data, sc, i % per_group < forward);
  });
  return r;
}

template <typename T>
FftFloorTiming LaneBackpropFloor(const ConvGeometry& g, const LaneBackpropPlan& p,
                                 const ParallelFor& pf) {
  const LaneKit<T, T> kit(p.fft_w);
  FftFloorTiming r;
  if (!kit.Fits()) return r;
  const int64_t lane_groups = CeilDiv(g.groups, kFftLanes);
  const int64_t scratch = 2 * kit.GroupValues();  // what Fits() allows ducc0
  WorkerBuffers<T> buf(pf.num_workers(), kit.GroupValues() + scratch + 16);
  // Per group: three per image (dL/doutput and input forward, dL/dinput inverse), one for dL/dfilter.
  const int64_t per_group = 3 * g.batch + 1;
  r.transforms = lane_groups * per_group;
  r.flops = double(r.transforms) * double(kFftLanes) * RealFlops(p.fft_w);
  r.seconds = Timed(pf, lane_groups * per_group, [&](int64_t b, int64_t e, int worker) {
    T* data = buf.Of(worker);
    T* sc = data + (kit.GroupValues() + 15) / 16 * 16;
    for (int64_t i = b; i < e; ++i) {
      const int64_t k = i % per_group;
      kit.Transform(data, sc, k < 3 * g.batch && k % 3 != 2);
    }
  });
  return r;
}

template <typename T>
FftFloorTiming Floor(const ConvGeometry& g, const FftPlan& p, FloorFilter filter,
                     const ParallelFor& pf) {
  return p.lanes ? LaneFloor<T>(g, p, filter, pf) : PlaneFloor<T>(g, p, filter, pf);
}

}  // namespace

FftFloorTiming TimeFftFloor(const ConvGeometry& g, DType dtype, const FftPlan& plan,
                            FloorFilter filter, const ParallelFor& pf) {
  if (g.no_work()) return {};
  return dtype == DType::kDouble ? Floor<double>(g, plan, filter, pf)
                                 : Floor<float>(g, plan, filter, pf);
}

FftFloorTiming TimeLaneBackpropFloor(const ConvGeometry& g, DType dtype,
                                     const LaneBackpropPlan& plan, const ParallelFor& pf) {
  if (g.no_work()) return {};
  return dtype == DType::kDouble ? LaneBackpropFloor<double>(g, plan, pf)
                                 : LaneBackpropFloor<float>(g, plan, pf);
}

}  // namespace tfbigconv
