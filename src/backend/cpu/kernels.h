// The CPU backend's compute kernels: f32 activations, weights dense in F32,
// F16 or BF16, or quantized (WeightMatrix::format; callers never change).
// Each entry point dispatches at run time to the widest ISA the processor
// has: AVX-512, AVX2+FMA, or portable scalar code; quantized weights use the
// VNNI int8 dot products where present (kernels_quant.h).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::cpu {

// y[t, r] = sum_c x[t, c] * W[r, c] + (bias ? bias[r] : 0)
//   x: [n, w.cols] f32 row-major, y: [n, w.rows] f32 row-major, bias: [w.rows] or null.
// n == 1 is the decode GEMV and must stream W at memory bandwidth; larger n
// (prefill) reuses each loaded weight row across the n activations.
// Quantized W (WeightFormat::Affine): x is quantized to int8 per block of 32
// values first, so y differs from the f32 product with the dequantized
// weights by that rounding (relative error ~1e-3 of |x|·|w|).
void matmul(ThreadPool& pool, const float* x, int64_t n, const WeightMatrix& w, const float* bias,
            float* y);

// Single-threaded vector helpers for attention and norms (SIMD-dispatched).
float dot(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);  // y += a * x

// The ISA chosen at run time ("avx512", "avx2", "scalar"); TANDEM_ISA=avx2|scalar
// in the environment forces a narrower one (tests use it to cover each path).
std::string_view active_isa();

// The quantized-matmul kernels in use: "avx512-vnni", "avx2-vnni", "avx2" or
// "scalar".
std::string_view active_quant_isa();

// Test hook: false makes the quantized kernels ignore VNNI (the vpmaddubsw
// path); true restores the default.
void set_vnni_for_testing(bool allowed);

// Test hook: true makes matmul over quantized weights use exact f32
// activations (each weight row dequantized; slow), isolating the weights'
// rounding from the activations'; false restores the int8 kernels.
void set_quant_reference_for_testing(bool enabled);

// Test hook: makes every later call use `isa` ("avx512", "avx2" or "scalar")
// regardless of TANDEM_ISA; "" restores the run-time choice. Returns false,
// changing nothing, when the processor lacks that ISA or the name is unknown.
bool set_isa_for_testing(std::string_view isa);

}  // namespace tandem::cpu
