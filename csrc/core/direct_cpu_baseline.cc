// The direct-convolution micro-kernels built for baseline (see CMakeLists.txt for flags).
#define TFBIGCONV_ISA_NS baseline
#define TFBIGCONV_VEC_BYTES 16
#include "direct_cpu_kernels.inc"
