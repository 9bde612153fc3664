// The direct-convolution micro-kernels built for avx512 (see CMakeLists.txt for flags).
#define TFBIGCONV_ISA_NS avx512
#define TFBIGCONV_VEC_BYTES 64
#include "direct_cpu_kernels.inc"
