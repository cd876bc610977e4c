// GGUF tensor data → tandem weights: the scalar dequantization of every block
// type tandem reads, and the lossless re-packing of block types into the MLX
// affine storage (WeightFormat::Affine) the quantized kernels take.
//
// Block formats (ggml; rows run along dims[0], blocks are contiguous in a row):
//  - Q8_0: 32 values in 34 bytes: f16 d, int8 q[32];           w = d·q
//  - Q4_0: 32 values in 18 bytes: f16 d, u8 qs[16];             w = d·(nibble − 8),
//          value j < 16 in the low nibble of qs[j], value j + 16 in its high nibble
//  - Q4_K: 256 values in 144 bytes: f16 d, f16 dmin, u8 scales[12] (eight
//          6-bit scales and mins), u8 qs[128]; sub-block j of 32:
//          w = d·sc[j]·q − dmin·m[j]; each 64-value chunk takes 32 bytes of qs,
//          its first 32 values in the low nibbles, the next 32 in the high ones
//  - Q6_K: 256 values in 210 bytes: u8 ql[128], u8 qh[64], int8 sc[16], f16 d;
//          w = d·sc[i/16]·(q − 32), q 6-bit (low 4 bits in ql, high 2 in qh)
//
// Affine mapping (w = scale·q + bias per group, q unsigned):
//  - Q8_0 → 8-bit, group 32: q = q_s + 128, scale = d, bias = −128·d
//  - Q4_0 → 4-bit, group 32: q = nibble, scale = d, bias = −8·d
//    both with F16 scales when every −128·d / −8·d is finite in f16 (then
//    exact: d is an f16 and the factor a power of two), else F32 scales;
//  - Q4_K → 4-bit, group 32, F32 scales: scale = d·sc and bias = −dmin·m are
//    exact in f32 (11-bit × 6-bit products) but not in f16/bf16, so the f32
//    storage is what makes it lossless (6 bits per weight instead of 4.5).
//  - Q6_K has groups of 16 (the kernels take 32/64/128) and 6-bit codes: it is
//    re-quantized to 8 bits in groups of 32 (gguf_q6k_to_affine), the one
//    lossy conversion.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "model/gguf.h"
#include "model/quantized.h"

namespace tandem {

// Dequantizes `n` values (a whole number of blocks) of type `t` at `src` into
// f32 `dst`, exactly as ggml's reference dequantization computes them.
void gguf_dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst);

// True for the block types gguf_to_affine takes (Q8_0, Q4_0, Q4_K).
bool gguf_affine_lossless(GgmlType t);

// Re-packs a [rows, cols] tensor of Q8_0 / Q4_0 / Q4_K blocks at `src` into a
// new affine WeightMatrix whose buffers are appended to `owned` (their size
// added to `owned_bytes`). Dequantizing a row of the result gives exactly the
// values gguf_dequantize gives.
WeightMatrix gguf_to_affine(GgmlType t, const uint8_t* src, int64_t rows, int64_t cols,
                            OwnedBuffers& owned, uint64_t& owned_bytes);

// Re-quantizes a [rows, cols] Q6_K tensor (cols a multiple of 256) at `src`
// to 8-bit affine codes in groups of 32 with F32 scales (1.25 bytes a
// weight; BF16, the alternative, takes 2 and the int8 kernels run 8-bit
// codes faster), new buffers appended to `owned`. A group is two Q6_K
// sub-blocks of 16, scaled d·sc_a and d·sc_b: the scale m / 4, m = max(|d·sc_a|,
// |d·sc_b|), puts the larger sub-block's values exactly on the grid (codes
// ±4·(q − 32) shifted to start at 0) and the other's within m / 8 of theirs
// (an eighth of the larger sub-block's own Q6_K step); a group whose codes
// would span 257 values (sub-blocks of equal |scale| and opposite signs at
// both ends) takes its min/max grid instead (within (max − min) / 510).
WeightMatrix gguf_q6k_to_affine(const uint8_t* src, int64_t rows, int64_t cols, OwnedBuffers& owned,
                                uint64_t& owned_bytes);

}  // namespace tandem
