// The direct-convolution micro-kernels built for avx2 (see CMakeLists.txt for flags).
#define TFBIGCONV_ISA_NS avx2
#define TFBIGCONV_VEC_BYTES 32
#include "direct_cpu_kernels.inc"
