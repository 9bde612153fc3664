// ducc0 and its wrappers built for avx512 (see CMakeLists.txt for flags): the
// same 8-float vectors as avx2 (ducc0's widest for FFTs), with AVX-512's 32
// registers, which its radix passes spill less with (8-10% on the Hyena passes).
#define TFBIGCONV_FFT_NS fft_avx512
#include "fft_backend_cpu_kernels.inc"
