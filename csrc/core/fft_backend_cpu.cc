#include "fft_backend_cpu.h"

#include <algorithm>

#include "isa.h"

namespace tfbigconv {
#define TFBIGCONV_DECLARE_BACKENDS(ns)       \
  namespace ns {                             \
  extern const fft::Backend<float> kFloat;   \
  extern const fft::Backend<double> kDouble; \
  }
TFBIGCONV_DECLARE_BACKENDS(fft_baseline)
TFBIGCONV_DECLARE_BACKENDS(fft_avx2)
TFBIGCONV_DECLARE_BACKENDS(fft_avx512)
#undef TFBIGCONV_DECLARE_BACKENDS

namespace fft {
namespace {

template <typename T>
const Backend<T>& Pick();
template <>
const Backend<float>& Pick<float>() {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  static const Backend<float>& b = ActiveIsa() == Isa::kBaseline ? fft_baseline::kFloat
                                  : ActiveIsa() == Isa::kAvx2   ? fft_avx2::kFloat
                                                                : fft_avx512::kFloat;
  return b;
#else
  return fft_baseline::kFloat;
#endif
}
template <>
const Backend<double>& Pick<double>() {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  static const Backend<double>& b = ActiveIsa() == Isa::kBaseline ? fft_baseline::kDouble
                                  : ActiveIsa() == Isa::kAvx2   ? fft_avx2::kDouble
                                                                : fft_avx512::kDouble;
  return b;
#else
  return fft_baseline::kDouble;
#endif
}

}  // namespace

template <typename T>
void RealRowsForward(const T* in, int64_t in_stride, int64_t rows, int64_t n,
                     std::complex<T>* out, int64_t out_stride) {
  Pick<T>().real_rows_forward(in, in_stride, rows, n, out, out_stride);
}

template <typename T>
void ComplexColumns(std::complex<T>* data, int64_t rows, int64_t cols, int64_t row_stride,
                    bool forward) {
  // A transform of length 1 is the identity: a 1-D problem (height 1) has 1-D FFTs.
  if (rows == 1) return;
  Pick<T>().complex_columns(data, rows, cols, row_stride, forward);
}

template <typename T>
void RealRowsBackward(const std::complex<T>* in, int64_t in_stride, int64_t rows, int64_t n,
                      T* out, int64_t out_stride, T scale) {
  Pick<T>().real_rows_backward(in, in_stride, rows, n, out, out_stride, scale);
}

template <typename T>
LaneFft<T>::LaneFft(int64_t n) : backend_(&Pick<T>()), plan_(backend_->lane_create(n)) {}
template <typename T>
LaneFft<T>::~LaneFft() {
  backend_->lane_destroy(plan_);
}
template <typename T>
int64_t LaneFft<T>::width() const {
  return backend_->lane_width;
}
template <typename T>
int64_t LaneFft<T>::scratch_elements() const {
  return backend_->lane_scratch(plan_);
}
template <typename T>
void LaneFft<T>::Forward(T* data, T* scratch) const {
  backend_->lane_transform(plan_, data, scratch, true, T(1));
}
template <typename T>
void LaneFft<T>::Backward(T* data, T* scratch, T scale) const {
  backend_->lane_transform(plan_, data, scratch, false, scale);
}
template class LaneFft<float>;
template class LaneFft<double>;

#define INSTANTIATE(T)                                                                      \
  template void RealRowsForward<T>(const T*, int64_t, int64_t, int64_t, std::complex<T>*,   \
                                   int64_t);                                                \
  template void ComplexColumns<T>(std::complex<T>*, int64_t, int64_t, int64_t, bool);       \
  template void RealRowsBackward<T>(const std::complex<T>*, int64_t, int64_t, int64_t, T*,  \
                                    int64_t, T);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace fft
}  // namespace tfbigconv
