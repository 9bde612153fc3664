// ducc0 and its wrappers built for avx2 (see CMakeLists.txt for flags).
#define TFBIGCONV_FFT_NS fft_avx2
#include "fft_backend_cpu_kernels.inc"
