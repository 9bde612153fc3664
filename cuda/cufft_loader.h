// cuFFT, loaded at run time with dlopen so that the ops' .so loads (and the
// direct kernels work) on machines without cuFFT. Only the few entry points
// the FFT path uses are resolved.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

#if defined(TFBIGCONV_HAVE_CUFFT_H)
#include <cufft.h>
#else
// cuFFT's C ABI (cufft.h), declared here for builds where neither the toolkit
// nor the nvidia-cufft wheel provides the header. Values are cuFFT's own;
// with the header present (TFBIGCONV_HAVE_CUFFT_H) it is used instead.
typedef int cufftHandle;
typedef int cufftResult;
typedef int cufftType;
#define CUFFT_SUCCESS 0
#define CUFFT_R2C 0x2a
#define CUFFT_C2R 0x2c
#define CUFFT_D2Z 0x6a
#define CUFFT_Z2D 0x6c
#endif

namespace tfbigconv {
namespace gpu {

// The resolved entry points; void* arguments stand for cufftReal/Complex
// (and their double versions) so one table serves both precisions.
struct CufftApi {
  cufftResult (*Create)(cufftHandle*);
  cufftResult (*Destroy)(cufftHandle);
  cufftResult (*SetAutoAllocation)(cufftHandle, int);
  cufftResult (*MakePlanMany64)(cufftHandle, int, long long*, long long*, long long, long long,
                                long long*, long long, long long, cufftType, long long,
                                size_t*);
  cufftResult (*SetWorkArea)(cufftHandle, void*);
  cufftResult (*SetStream)(cufftHandle, cudaStream_t);
  cufftResult (*ExecR2C)(cufftHandle, void*, void*);
  cufftResult (*ExecC2R)(cufftHandle, void*, void*);
  cufftResult (*ExecD2Z)(cufftHandle, void*, void*);
  cufftResult (*ExecZ2D)(cufftHandle, void*, void*);
  std::string library;  // the file that was loaded
};

// The cuFFT API, loaded once per process (thread-safe); nullptr if no
// library was found, with *why (if given) saying what was tried.
const CufftApi* Cufft(std::string* why = nullptr);

}  // namespace gpu
}  // namespace tfbigconv
