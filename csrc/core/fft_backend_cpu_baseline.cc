// ducc0 and its wrappers built for baseline (see CMakeLists.txt for flags).
#define TFBIGCONV_FFT_NS fft_baseline
#include "fft_backend_cpu_kernels.inc"
