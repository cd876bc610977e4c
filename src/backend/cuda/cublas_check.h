// cuBLAS calls go through CUBLAS_CHECK, which throws tandem::Error naming
// the call, its status, the file and the line.
#pragma once

#include <cublas_v2.h>

#include "core/error.h"

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    const cublasStatus_t tandem_cublas_st_ = (call);                                            \
    if (tandem_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::tandem::fail("cuBLAS: %s failed with status %d (%s:%d)", #call, int(tandem_cublas_st_), \
                     __FILE__, __LINE__);                                                       \
  } while (0)
