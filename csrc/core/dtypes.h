// The dtypes the kernels handle, and 16-bit float conversions. The 16-bit
// types are plain bit containers so that kernels need no framework headers;
// TF's Eigen::half and bfloat16 have the same layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace tfbigconv {

enum class DType { kHalf, kBFloat16, kFloat, kDouble };

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kHalf: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat: return "float32";
    case DType::kDouble: return "float64";
  }
  return "?";
}

// Bytes of one element, and of the type the kernels compute in (the 16-bit
// types accumulate, and are transformed, in float).
inline int64_t DTypeBytes(DType t) { return t == DType::kDouble ? 8 : t == DType::kFloat ? 4 : 2; }
inline int64_t ComputeBytes(DType t) { return t == DType::kDouble ? 8 : 4; }

// Inverse of DTypeName; false for any other name.
inline bool ParseDType(const char* name, DType* out) {
  for (DType t : {DType::kHalf, DType::kBFloat16, DType::kFloat, DType::kDouble})
    if (std::strcmp(name, DTypeName(t)) == 0) {
      *out = t;
      return true;
    }
  return false;
}

inline float ToFloat(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { ++e; man <<= 1; } while ((man & 0x400) == 0);
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as Eigen::half does.
inline f16 FromFloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  uint16_t out;
  if (x >= 0x7f800000u) {
    out = x > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (x >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    out = 0x7c00;
  } else if (x < 0x38800000u) {  // subnormal half or zero
    float af;
    std::memcpy(&af, &x, 4);
    // Adding 0.5 aligns the mantissa so the FPU rounds to the half grid.
    float t = af + 0.5f;
    uint32_t tb;
    std::memcpy(&tb, &t, 4);
    out = uint16_t(tb - 0x3f000000u);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1;
    x += 0xc8000fffu + mant_odd;  // rebias exponent and round
    out = uint16_t(x >> 13);
  }
  return f16{uint16_t(out | sign)};
}

inline float ToFloat(bf16 b) {
  const uint32_t bits = uint32_t(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16 FromFloatToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((x >> 16) | 0x40)};  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1);
  return bf16{uint16_t(x >> 16)};
}

// Storage type S <-> compute type T (float for 16-bit types).
template <typename T> inline T Load(float v) { return T(v); }
template <typename T> inline T Load(double v) { return T(v); }
template <typename T> inline T Load(f16 v) { return T(ToFloat(v)); }
template <typename T> inline T Load(bf16 v) { return T(ToFloat(v)); }

template <typename S, typename T> inline S Store(T v) { return S(v); }
template <> inline f16 Store<f16, float>(float v) { return FromFloatToF16(v); }
template <> inline bf16 Store<bf16, float>(float v) { return FromFloatToBF16(v); }

}  // namespace tfbigconv
