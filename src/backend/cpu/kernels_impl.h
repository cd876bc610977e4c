// Internal to the CPU kernels: the per-ISA entry points that kernels.cpp
// dispatches to. Each ISA lives in its own translation unit compiled with that
// ISA's flags (kernels_avx2.cpp, kernels_avx512.cpp); kernels.cpp holds the
// portable scalar reference.
//
// Rule for the ISA translation units: define everything in an anonymous
// namespace and call no inline or template function from a shared header
// (std::min, std::vector, dtype.h helpers, ...). The linker keeps one copy of
// each such function across all objects, and a copy compiled with -mavx512f
// could then run on a processor without AVX-512. The drivers both ISAs share
// (row splitting, GEMM tiling) are therefore not a header but
// kernels_isa_driver.inc, included inside each file's anonymous namespace.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"
#include "core/tensor.h"

namespace tandem::cpu::detail {

// matmul uses the streaming kernel up to this many activation rows and the
// cache-blocked GEMM beyond. Measured with bench/gemv.cpp --n on the 2-core
// EPYC (AVX-512, bf16): streaming is 1.2-1.6x faster at n = 16, even at n = 32,
// and 1.1-2x slower at n = 512, where its re-reads of x leave the L2.
constexpr int64_t kStreamMaxN = 16;

struct IsaKernels {
  const char* name;
  // Streaming matmul for small n (decode GEMV and n up to kStreamMaxN):
  //   y[t * w.rows + r] = sum_c x[t * w.cols + c] * W[r, c] + (bias ? bias[r] : 0)
  //   for t in [0, n), r in [r0, r1). Reads each weight once from memory, so
  //   its speed is the memory bandwidth. Single-threaded; the caller splits rows.
  void (*stream)(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1);
  // Prefill GEMM, same contract as stream for any n: reuses each weight
  //   across many activation rows (cache-blocked), so its speed is the FMA
  //   throughput. Single-threaded; the caller splits rows or activation rows.
  void (*gemm)(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
               int64_t r0, int64_t r1);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);
};

// The prefill GEMM over bf16 weights and bf16 activations (a processor with
// AVX-512 BF16): stream/gemm's contract with x already bf16,
//   y[t * w.rows + r] = sum_c bf16 x[t * w.cols + c] * W[r, c] (+ bias[r]),
// each product exact and the sum in f32. w.dtype must be BF16.
// Single-threaded; the caller splits rows or activation rows.
struct Bf16Kernels {
  // dst[i] = x[i] rounded to bf16 (nearest even) for i < n.
  void (*round)(const float* x, int64_t n, uint16_t* dst);
  void (*gemm)(const uint16_t* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
               int64_t r0, int64_t r1);
};
extern const Bf16Kernels kAvx512Bf16Kernels;  // kernels_avx512bf16.cpp

// Matmuls over WeightFormat::PackedBf16 weights (kernels_packed_avx512bf16.cpp;
// the portable reference in kernels_packed.cpp). pack: row blocks [b0, b1)
// of 16 rows of a dense rows x cols BF16 matrix (cols even) into the packed
// layout at dst (pad rows zero). matmul_f32 / matmul_bf16: stream/gemm's
// contract (x f32, or x already rounded to bf16 with rows of w.cols values)
// for output rows [r0, r1), r0 a multiple of 16. Single-threaded.
struct PackedKernels {
  void (*pack)(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t b0,
               int64_t b1);
  void (*matmul_f32)(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                     int64_t r0, int64_t r1);
  void (*matmul_bf16)(const uint16_t* x, int64_t n, const WeightMatrix& w, const float* bias,
                      float* y, int64_t r0, int64_t r1);
};
extern const PackedKernels kScalarPackedKernels;  // kernels_packed.cpp
extern const PackedKernels kAvx2PackedKernels;    // kernels_packed_avx2.cpp: matmul_f32 only
extern const PackedKernels kAvx512PackedKernels;  // kernels_packed_avx512bf16.cpp

// The attention's building blocks (kernels.h's attention_scores,
// attention_values, exp_shifted_sum).
struct AttentionKernels {
  void (*scores)(const float* q, int nq, int64_t q_stride, const float* k, int64_t k_stride,
                 int64_t nk, int64_t dim, float scale, float* s, int64_t s_stride);
  void (*values)(const float* p, int nq, int64_t p_stride, const float* v, int64_t v_stride,
                 int64_t nk, int64_t dim, float* out, int64_t out_stride);
  float (*exp_sum)(float* x, int64_t n, float shift);
  // kernels.h's attention_tile for head dims 64, 128, 256 and 512; null
  // where the ISA has none.
  void (*tile)(const TileRows& rows, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
               int64_t dim, float scale, float* scratch);
};
extern const AttentionKernels
    kScalarAttention;  // kernels.cpp (AVX2 takes its scores, values, exp_sum)
extern const AttentionKernels kAvx512Attention;  // attention_avx512.cpp
extern const AttentionKernels kAvx2Attention;    // attention_avx2.cpp: the tile only

// The MLP's gated activations (ops.h's silu_mul, gelu_tanh_mul).
struct GatedKernels {
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  void (*gelu_tanh_mul)(float* gate, const float* up, int64_t n);
};
extern const GatedKernels kScalarGated;  // ops.cpp
extern const GatedKernels kAvx2Gated;    // activations_avx2.cpp
extern const GatedKernels kAvx512Gated;  // activations_avx512.cpp
const GatedKernels& gated_kernels();     // kernels.cpp: the active ISA's

extern const IsaKernels kScalarKernels;  // kernels.cpp
extern const IsaKernels kAvx2Kernels;    // kernels_avx2.cpp: AVX2 + FMA + F16C
extern const IsaKernels kAvx512Kernels;  // kernels_avx512.cpp: AVX-512 F/BW/VL/DQ

}  // namespace tandem::cpu::detail
