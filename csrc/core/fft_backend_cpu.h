// A thin wrapper over ducc0's FFTs (the library TensorFlow itself uses), on
// plain pointers. Every call is single-threaded: callers parallelise over
// channels, images and frequency blocks themselves. ducc0 is built for the
// baseline ISA, AVX2 and AVX-512 (its widest float vectors are 8 lanes in
// both; AVX-512 adds registers), and the build that ActiveIsa() allows is used.
#pragma once

#include <complex>
#include <cstdint>

namespace tfbigconv {
namespace fft {

// One ISA's build of the three transforms below (fft_backend_cpu_kernels.inc).
template <typename T>
struct Backend {
  void (*real_rows_forward)(const T*, int64_t, int64_t, int64_t, std::complex<T>*, int64_t);
  void (*complex_columns)(std::complex<T>*, int64_t, int64_t, int64_t, bool);
  void (*real_rows_backward)(const std::complex<T>*, int64_t, int64_t, int64_t, T*, int64_t, T);
  int64_t lane_width;
  void* (*lane_create)(int64_t);
  void (*lane_destroy)(void*);
  int64_t (*lane_scratch)(const void*);
  void (*lane_transform)(const void*, T*, T*, bool, T);
};

// Forward real FFT along each of `rows` rows of length n (stride in_stride
// elements) into rows of n/2+1 bins (stride out_stride).
template <typename T>
void RealRowsForward(const T* in, int64_t in_stride, int64_t rows, int64_t n,
                     std::complex<T>* out, int64_t out_stride);

// In-place complex FFT along the columns of a rows x cols array whose rows
// are row_stride elements apart. forward=false is the unscaled inverse.
template <typename T>
void ComplexColumns(std::complex<T>* data, int64_t rows, int64_t cols, int64_t row_stride,
                    bool forward);

// Inverse real FFT of `rows` rows of n/2+1 bins (stride in_stride) into rows
// of n reals (stride out_stride), multiplied by scale.
template <typename T>
void RealRowsBackward(const std::complex<T>* in, int64_t in_stride, int64_t rows, int64_t n,
                      T* out, int64_t out_stride, T scale);

// Real FFTs of n points over `width()` rows stored interleaved: value i of
// row j at data[i * width() + j], the layout of the ISA's SIMD vectors
// (width() is 8 floats with AVX2, 4 with SSE2). The forward transform
// leaves the halfcomplex spectrum in place: bin 0's real part at position
// 0, then bin k's real and imaginary parts at positions 2k - 1 and 2k, and
// bin n/2's real part at n - 1 when n is even (positions, each holding
// width() values). Backward is its unscaled inverse times `scale`. A plan
// is built once per size and used by any number of threads; data must be
// aligned to 64 bytes, and each call needs its own scratch of
// scratch_elements() values, equally aligned.
template <typename T>
class LaneFft {
 public:
  explicit LaneFft(int64_t n);
  ~LaneFft();
  LaneFft(const LaneFft&) = delete;
  LaneFft& operator=(const LaneFft&) = delete;
  int64_t width() const;
  int64_t scratch_elements() const;
  void Forward(T* data, T* scratch) const;
  void Backward(T* data, T* scratch, T scale) const;

 private:
  const Backend<T>* backend_;
  void* plan_;
};

}  // namespace fft
}  // namespace tfbigconv
