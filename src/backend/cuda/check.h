// CUDA error handling: every runtime and cuBLAS call goes through CUDA_CHECK
// / CUBLAS_CHECK, which throw tandem::Error naming the call, the file and
// the line (load time and the API boundary; the hot path checks once per
// step).
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace tandem::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);

}  // namespace tandem::cuda

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    const cudaError_t tandem_cuda_err_ = (call);                                     \
    if (tandem_cuda_err_ != cudaSuccess)                                             \
      ::tandem::cuda::throw_cuda_error(tandem_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
