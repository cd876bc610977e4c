// Quantized weight formats: the scalar definitions every kernel is tested
// against, and the conversions the loader and `tandem quantize` use.
//
// MLX affine quantization (WeightFormat::Affine), per group of G consecutive
// values of a row (G = 32, 64 or 128), with n = 2^bits − 1:
//   w = scale · q + bias,  q ∈ [0, n] unsigned, packed little-end first: value
//   i of a row is bits [(i·bits) % 32, …) of word (i·bits) / 32.
// affine_quantize_row reproduces mlx.core.quantize (mlx/ops.cpp,
// affine_quantize): with lo/hi the group's min/max,
//   scale = max((hi − lo) / n, 1e-7), negated unless |lo| > |hi|;
//   edge  = |lo| > |hi| ? lo : hi          (the extreme of larger magnitude)
//   q0    = round(edge / scale);  if q0 ≠ 0: scale = edge / q0, bias = edge
//                                 else:      bias = 0
//   q     = clamp(round((w − bias) / scale), 0, n)
// so the extreme of larger magnitude is exact and 0 is exact (at q = −q0);
// the far extreme can land up to one step past the last code and is clipped.
// As in MLX (whose CPU fallback computes in the weight's dtype), every
// intermediate is rounded to `scale_dtype` — the dtype of the weights being
// quantized — and round() is round-half-to-even.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace tandem {

// float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no
// infinities, S.1111.111 is NaN; max ±448) to f32, exactly.
float fp8_e4m3_to_f32(uint8_t v);

// Quantizes one row of `cols` values (cols % group_size == 0) to MLX affine
// codes: `codes` receives cols·bits/32 words, `scales` and `biases`
// cols/group_size values of `scale_dtype` (F32, F16 or BF16: the weights'
// dtype, in which MLX computes). bits: 4 or 8.
void affine_quantize_row(const float* w, int64_t cols, int bits, int group_size, DType scale_dtype,
                         uint32_t* codes, void* scales, void* biases);

// The code of value i of a packed affine row.
inline uint32_t affine_code(const uint32_t* row, int bits, int64_t i) {
  const int64_t per_word = 32 / bits;
  return (row[i / per_word] >> (bits * (i % per_word))) & ((1u << bits) - 1u);
}

// The code of value (r, i) of an Affine or PackedAffine matrix.
inline uint32_t affine_code_at(const WeightMatrix& w, int64_t r, int64_t i) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  if (w.format == WeightFormat::PackedAffine) {
    int shift = 0;
    const size_t at = packed_affine_byte(w.cols, w.bits, r, i, &shift);
    return (uint32_t(data[at]) >> shift) & ((1u << w.bits) - 1u);
  }
  return affine_code(reinterpret_cast<const uint32_t*>(data + size_t(r) * w.row_bytes()), w.bits,
                     i);
}
// Index of the scale (and bias) of row r, group g of an Affine or
// PackedAffine matrix, in elements of w.scales (w.biases).
inline size_t affine_scale_index(const WeightMatrix& w, int64_t r, int64_t g) {
  return w.format == WeightFormat::PackedAffine ? packed_affine_scale_index(w.groups(), r, g)
                                                : size_t(r * w.groups() + g);
}

// Row r of any WeightMatrix as f32 (dense: converted; PackedBf16: gathered;
// Affine, PackedAffine: scale·q + bias in f32). Used for embedding lookups and by the reference
// kernels.
void dequantize_row(const WeightMatrix& w, int64_t r, float* dst);

// Checks that an Affine matrix is one the kernels take (bits 4 or 8, group
// 32/64/128 dividing cols, scales in F32/F16/BF16); throws Error naming `what`.
void check_affine(const WeightMatrix& w, const char* what);

}  // namespace tandem
