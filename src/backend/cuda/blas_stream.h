// A non-blocking stream with a cuBLAS handle on it, a cuBLASLt handle and
// one 32 MiB workspace that both use (their calls run in stream order), as
// the decoder sets them up: for the benchmarks and tests that call cuBLAS
// and GemmTuner the way the decoder does.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/check.h"
#include "backend/cuda/cublas_check.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

struct BlasOnStream {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  DeviceBuffer workspace{size_t(32) << 20};

  BlasOnStream() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas));
    CUBLAS_CHECK(cublasSetStream(blas, stream));
    CUBLAS_CHECK(cublasSetWorkspace(blas, workspace.get(), workspace.bytes()));
    CUBLAS_CHECK(cublasLtCreate(&lt));
  }
  ~BlasOnStream() {
    cublasLtDestroy(lt);
    cublasDestroy(blas);
    cudaStreamDestroy(stream);
  }
  BlasOnStream(const BlasOnStream&) = delete;
  BlasOnStream& operator=(const BlasOnStream&) = delete;
};

}  // namespace tandem::cuda
