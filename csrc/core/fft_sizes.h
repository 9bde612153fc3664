// The FFT tile-size facts shared by the CPU planner (fft_plan.cc) and the GPU
// planner (cuda/fft_gpu.cu): which transform sizes are fast, which
// (tile, transform size) pairs a dimension can use, and a transform's flops.
// Header-only so that both the host library and the CUDA library use it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tfbigconv {

// The sizes with no prime factor above 7 up to 2^32 (about 6,600), ascending;
// built once. Planners ask for the next one of each candidate tile, so
// scanning the integers between (dividing each) cost a 1-D plan of 4096
// points about 40 us per op call.
inline const std::vector<int64_t>& SmoothSizes() {
  static const std::vector<int64_t> sizes = [] {
    constexpr int64_t kLimit = int64_t(1) << 32;
    std::vector<int64_t> v;
    for (int64_t a = 1; a <= kLimit; a *= 2)
      for (int64_t b = a; b <= kLimit; b *= 3)
        for (int64_t c = b; c <= kLimit; c *= 5)
          for (int64_t d = c; d <= kLimit; d *= 7) v.push_back(d);
    std::sort(v.begin(), v.end());
    return v;
  }();
  return sizes;
}

// Smallest size >= n with no prime factor above 7: the sizes ducc0 and cuFFT
// transform fastest.
inline int64_t GoodFftSize(int64_t n) {
  const std::vector<int64_t>& sizes = SmoothSizes();
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), std::max<int64_t>(n, 1));
  if (it != sizes.end()) return *it;
  for (int64_t m = n;; ++m) {  // beyond the table
    int64_t r = m;
    for (int64_t p : {2, 3, 5, 7})
      while (r % p == 0) r /= p;
    if (r == 1) return m;
  }
}

// Overlap-save along one dimension: an output tile of `tile` samples needs a
// transform of `fft` >= (tile - 1) * stride + effective_filter samples.
struct TileCandidate {
  int64_t tile, fft;
};

// The least transform a tile of the whole output needs along one dimension
// (out outputs; the input, with in_dilation's zeros, of virtual_in samples
// after pad_front samples of padding; negative: cropping). The window is
// (out - 1) * stride + effective_filter samples, padding at both ends; the
// transform is circular, so it may be shorter than the window: the window's
// samples from the transform's length on are padding (zeros) and, wrapped
// onto its start, meet only the leading padding (zeros) there. Kernels stage
// the window up to the transform's length as ever (docs/ARCHITECTURE.md, 4).
inline int64_t WholeTileFftNeed(int64_t out, int64_t stride, int64_t effective_filter,
                                int64_t pad_front, int64_t virtual_in) {
  const int64_t window = (out - 1) * stride + effective_filter;
  const int64_t front = std::min(std::max<int64_t>(pad_front, 0), window);
  const int64_t data_end = std::min(window, front + std::max<int64_t>(virtual_in, 0));
  return std::max({effective_filter, (out - 1) * stride + 1, data_end, window - front});
}

// Every good transform size from the smallest that holds the filter up to the
// one that holds the whole output, with the largest tile each allows (tiles
// that do not grow are skipped); the whole output's as WholeTileFftNeed allows,
// which drops the candidates whose transforms are not smaller. `out` >= 1.
inline std::vector<TileCandidate> TileCandidates(int64_t out, int64_t stride,
                                                 int64_t effective_filter, int64_t pad_front,
                                                 int64_t virtual_in) {
  std::vector<TileCandidate> c;
  int64_t last_tile = 0;
  for (int64_t f = GoodFftSize(effective_filter);; f = GoodFftSize(f + 1)) {
    const int64_t tile = std::min(out, (f - effective_filter) / stride + 1);
    if (tile > last_tile) c.push_back({tile, f});
    last_tile = tile;
    if (tile == out) break;
  }
  const int64_t whole =
      GoodFftSize(WholeTileFftNeed(out, stride, effective_filter, pad_front, virtual_in));
  if (whole < c.back().fft) {
    while (!c.empty() && c.back().fft >= whole) c.pop_back();
    c.push_back({out, whole});
  }
  return c;
}

// Flops of a complex FFT of length n (the usual 5 n log2 n).
inline double ComplexFftFlops(int64_t n) {
  return n < 2 ? 0.0 : 5.0 * double(n) * std::log2(double(n));
}

}  // namespace tfbigconv
