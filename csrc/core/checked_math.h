// Overflow-checked size arithmetic for geometry and planning. Sizes are
// int64; a product or sum that would overflow either fails validation
// (geometry.cc, with an error naming the tensor) or saturates at kSizeMax
// (planning: a saturated workspace is one that fits no limit), so that no
// size ever wraps to a negative or small number.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

namespace tfbigconv {

constexpr int64_t kSizeMax = std::numeric_limits<int64_t>::max();

// a * b overflows int64 (a, b >= 0)?
inline bool MulOverflows(int64_t a, int64_t b) { return a != 0 && b > kSizeMax / a; }
// a + b overflows int64 (a, b >= 0)?
inline bool AddOverflows(int64_t a, int64_t b) { return b > kSizeMax - a; }

// Saturating products and sums of non-negative sizes.
inline int64_t SatMul(int64_t a, int64_t b) { return MulOverflows(a, b) ? kSizeMax : a * b; }
inline int64_t SatMul(std::initializer_list<int64_t> xs) {
  int64_t p = 1;
  for (int64_t x : xs) {
    if (x == 0) return 0;
    p = SatMul(p, x);
  }
  return p;
}
inline int64_t SatAdd(int64_t a, int64_t b) { return AddOverflows(a, b) ? kSizeMax : a + b; }

// ceil(a / b) for a >= 0, b > 0 (a + b - 1 must not overflow).
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The product of non-negative sizes, or false if it overflows int64.
inline bool CheckedProduct(const std::vector<int64_t>& xs, int64_t* out) {
  int64_t p = 1;
  bool zero = false;
  bool overflow = false;
  for (int64_t x : xs) {
    if (x == 0) zero = true;
    else if (MulOverflows(p, x)) overflow = true;
    else p *= x;
  }
  if (zero) p = 0;
  *out = p;
  return zero || !overflow;
}

}  // namespace tfbigconv
