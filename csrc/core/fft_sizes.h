// The FFT tile-size facts shared by the CPU planner (plan.cc) and the GPU
// planner (cuda/fft_gpu.cu): which transform sizes are fast, which
// (tile, transform size) pairs a dimension can use, and a transform's flops.
// Header-only so that both the host library and the CUDA library use it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tfbigconv {

// Smallest size >= n with no prime factor above 7: the sizes ducc0 and cuFFT
// transform fastest.
inline int64_t GoodFftSize(int64_t n) {
  for (int64_t m = std::max<int64_t>(n, 1);; ++m) {
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

// Every good transform size from the smallest that holds the filter up to the
// one that holds the whole output, with the largest tile each allows (tiles
// that do not grow are skipped). `out` >= 1.
inline std::vector<TileCandidate> TileCandidates(int64_t out, int64_t stride,
                                                 int64_t effective_filter) {
  std::vector<TileCandidate> c;
  int64_t last_tile = 0;
  for (int64_t f = GoodFftSize(effective_filter);; f = GoodFftSize(f + 1)) {
    const int64_t tile = std::min(out, (f - effective_filter) / stride + 1);
    if (tile > last_tile) c.push_back({tile, f});
    last_tile = tile;
    if (tile == out) break;
  }
  return c;
}

// Flops of a complex FFT of length n (the usual 5 n log2 n).
inline double ComplexFftFlops(int64_t n) {
  return n < 2 ? 0.0 : 5.0 * double(n) * std::log2(double(n));
}

}  // namespace tfbigconv
