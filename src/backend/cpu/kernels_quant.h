// Internal to the CPU kernels: matmul over quantized weights (WeightFormat
// other than Dense), per ISA. kernels.cpp routes cpu::matmul here.
//
// Method (the same on every ISA; kernels_quant.cpp holds the scalar reference
// that defines it): each activation row is quantized in blocks of 32 values to
// int8 with one f32 scale per block, d = max|x| / 127, q = round(x · 127 /
// max|x|); the sum of the quantized activations over each weight group,
// Σ_blk d_blk · Σ q (blocks in order), is kept as well. For an affine weight
// row (w = s·c + b per group g):
//   y = Σ_blocks d_blk · s_g(blk) · Σ_{i∈blk} c_i·q_i  +  Σ_g b_g · Σ_{i∈g} d·q_i
// which is exactly the dot product of the dequantized weights with the
// dequantized activations (up to f32 rounding): the error is that of the
// activations alone, at most Σ |w_i| · d/2. (The exact f32 sum of x in the
// bias term would be worse: the error would then scale with |s·c_i|, which
// can be several times |w_i| when b is large.)
// The integer dot products are u8 (codes) × s8 (activations): VNNI vpdpbusd
// where the processor has it (AVX-512 VNNI, AVX-VNNI), else vpmaddubsw +
// vpmaddwd. Each ISA lays its prepared activations out as its inner loop
// wants (the 4-bit codes of a byte are values 2j and 2j+1, so the activations
// are split into even and odd values), so a prepared buffer is only read by
// the kernels that wrote it.
//
// The ISA files keep kernels_impl.h's rules (anonymous namespace, no shared
// inline or template helpers).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tandem::cpu::detail {

struct QuantKernels {
  const char* name;
  // Bytes of one prepared activation row for `w` (a multiple of 64).
  size_t (*act_bytes)(const WeightMatrix& w);
  // Quantizes one activation row of w.cols values into `out` (act_bytes(w)
  // bytes, 64-byte aligned).
  void (*prepare)(const float* x, const WeightMatrix& w, uint8_t* out);
  // y[t * w.rows + r] = x[t] · W[r] + (bias ? bias[r] : 0) for t in [0, n),
  // r in [r0, r1), from n prepared rows act_bytes(w) apart. Single-threaded.
  void (*compute)(const uint8_t* acts, int64_t n, const WeightMatrix& w, const float* bias,
                  float* y, int64_t r0, int64_t r1);
};

// The prepared activation row of kScalarQuant and the packed kernels: q
// int8 [cols] | d f32 [cols / 32] (the blocks' scales) | xs f32 [groups]
// (Σ d·q over each weight group), each part 64-byte aligned. Byte offsets.
struct QuantActLayout {
  int64_t d, xs, total;
};
QuantActLayout quant_act_layout(const WeightMatrix& w);  // kernels_quant.cpp

// RV blocks of 16 rows of a PackedAffine matrix for the packed kernels: the
// first one's codes, scales and biases; the next ones `panel` bytes of
// codes and `sstride` bytes of scales further.
struct PackedPanels {
  const uint8_t* codes;
  int64_t panel;
  const uint8_t* scales;
  const uint8_t* biases;
  int64_t sstride;
};

extern const QuantKernels kScalarQuant;      // kernels_quant.cpp
extern const QuantKernels kAvx2Quant;        // kernels_quant_avx2.cpp: vpmaddubsw
extern const QuantKernels kAvxVnniQuant;     // kernels_quant_avxvnni.cpp: 256-bit vpdpbusd
extern const QuantKernels kAvx512VnniQuant;  // kernels_quant_avx512vnni.cpp
// Over WeightFormat::PackedAffine (kScalarQuant takes both formats): compute's
// r0 must be a multiple of 16. The prepared rows are kScalarQuant's.
extern const QuantKernels kAvx512VnniPackedQuant;  // kernels_qpacked_avx512vnni.cpp
extern const QuantKernels kAvxVnniPackedQuant;     // kernels_qpacked_avxvnni.cpp
extern const QuantKernels kAvx2PackedQuant;        // kernels_qpacked_avx2.cpp: vpmaddubsw

// Writes the blocks of 16 rows [b0, b1) of the Affine matrix `src` into the
// PackedAffine matrix `dst` (same shape, bits, group and dtype; its data,
// scales and biases writable). Portable; the loader splits blocks over threads.
void pack_affine_blocks(const WeightMatrix& src, const WeightMatrix& dst, int64_t b0, int64_t b1);

// The multithreaded driver: prepares the activations once, then splits the
// output rows (or, for few rows and many activation rows, the activations)
// over the pool, as the dense matmul does.
void quant_matmul(ThreadPool& pool, const QuantKernels& k, const float* x, int64_t n,
                  const WeightMatrix& w, const float* bias, float* y);

}  // namespace tandem::cpu::detail
