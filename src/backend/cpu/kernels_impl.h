// Internal to the CPU kernels: the per-ISA entry points that kernels.cpp
// dispatches to. Each ISA lives in its own translation unit compiled with that
// ISA's flags (kernels_avx2.cpp, kernels_avx512.cpp); kernels.cpp holds the
// portable scalar reference.
//
// Rule for the ISA translation units: define everything in an anonymous
// namespace and call no inline or template function from a shared header
// (std::min, std::vector, dtype.h helpers, ...). The linker keeps one copy of
// each such function across all objects, and a copy compiled with -mavx512f
// could then run on a processor without AVX-512.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::cpu::detail {

struct IsaKernels {
  const char* name;
  // Decode GEMV on a block of output rows:
  //   y[r] = sum_c x[c] * W[r, c] + (bias ? bias[r] : 0)   for r in [r0, r1).
  void (*gemv)(const float* x, const WeightMatrix& w, const float* bias, float* y, int64_t r0,
               int64_t r1);
  // Prefill GEMM on a block of output rows, for n activation rows:
  //   y[t * w.rows + r] = sum_c x[t * w.cols + c] * W[r, c] + (bias ? bias[r] : 0)
  //   for t in [0, n), r in [r0, r1). Single-threaded; the caller splits rows
  //   or activation rows across the pool.
  void (*gemm)(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
               int64_t r0, int64_t r1);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
};

extern const IsaKernels kScalarKernels;  // kernels.cpp
extern const IsaKernels kAvx2Kernels;    // kernels_avx2.cpp: AVX2 + FMA + F16C
extern const IsaKernels kAvx512Kernels;  // kernels_avx512.cpp: AVX-512 F/BW/VL/DQ

}  // namespace tandem::cpu::detail
