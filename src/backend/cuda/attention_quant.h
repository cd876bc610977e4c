// The attention kernels' quantized output (PagedAttention::out_quantized):
// a token's final output row also written as a 4-bit GEMV's int8
// activations — gemv_affine's Acts<4> row (affine_codes.h), each block of 32
// columns quantized as its quantize kernel does it (d = max|x| / 127, q =
// round-to-nearest-even(x · 127 / max|x|), and (d, d · Σ q) per block) — so
// the o projection reads them (GemvFusion::quantized_in) without a quantize
// launch of its own. The codes of a value are those the quantize kernel
// would give the f32 value the same kernel writes to `out`, bit for bit.
// Device code, for the attention .cu files.
#pragma once

#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.h"

namespace tandem::cuda {

// Token t's quantized row (heads · head_dim columns).
__device__ __forceinline__ uint8_t* quantized_row(const PagedAttention& p, int64_t t) {
  return p.out_quantized + size_t(t) * affine::Acts<4>::row_bytes(int(p.heads * p.head_dim));
}

// The byte of an Acts<4> row of `vecs` 32-column blocks that holds column c
// (0-31) of block blk: word c / 8 of the block's four (words 0-1 in plane 0,
// 2-3 in plane 1), whose 8 bytes hold its even in-word columns, then its odd
// ones.
__device__ __forceinline__ size_t acts4_byte(int vecs, int blk, int c) {
  const int word = c / 8, in_word = c % 8;
  return size_t(word / 2) * 16 * size_t(vecs) + size_t(blk) * 16 + size_t(word % 2) * 8 +
         size_t((in_word % 2) * 4 + in_word / 2);
}

__device__ __forceinline__ void store_block_meta(uint8_t* row, int cols, int blk, float amax,
                                                 int sum) {
  const float d = affine::int8_scale(amax);
  reinterpret_cast<float2*>(row + affine::Acts<4>::meta_at(cols))[blk] =
      make_float2(d, float(sum) * d);
}

// Block blk of `row` (cols columns) from a warp whose lane c holds column
// 32 · blk + c, value v. Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void store_quantized32(uint8_t* row, int cols, int blk, float v) {
  const int lane = int(threadIdx.x % 32);
  const float amax = warp_max(fabsf(v));
  const int q = affine::int8_code(v, affine::int8_inverse_scale(amax));
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  row[acts4_byte(cols / 32, blk, lane)] = uint8_t(int8_t(q));
  if (lane == 0) store_block_meta(row, cols, blk, amax, sum);
}

// One query row of a warp's mma output fragment (kv_rows.h's
// store_row_fragment layout: the 4 lanes tq = lane % 4 of a row hold dims
// col0 + 8n + 2tq and + 1 as v[n][0..1], n < NO), already normalized,
// quantized in blocks of 32 columns: NO a multiple of 4 and col0 of 32, so
// a block is 4 n-tiles of the same 4 lanes. Every lane of the warp must call
// it (shuffles within each row's lanes); only lanes with `store` write.
template <int NO>
__device__ __forceinline__ void store_quantized_fragment(uint8_t* row, int cols, int64_t col0,
                                                         const float (&v)[NO][2], bool store) {
  static_assert(NO % 4 == 0, "whole 32-column blocks in the fragment");
  const int tq = int(threadIdx.x % 4), vecs = cols / 32;
#pragma unroll
  for (int b = 0; b < NO / 4; ++b) {
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      amax = fmaxf(amax, fmaxf(fabsf(v[4 * b + k][0]), fabsf(v[4 * b + k][1])));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float id = affine::int8_inverse_scale(amax);
    int q[4][2], sum = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        q[k][e] = affine::int8_code(v[4 * b + k][e], id);
        sum += q[k][e];
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!store) continue;
    const int blk = int(col0 / 32) + b;
    // Column 8k + 2tq + e of the block: word k, in-word column 2tq + e.
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        row[acts4_byte(vecs, blk, 8 * k + 2 * tq + e)] = uint8_t(int8_t(q[k][e]));
    if (tq == 0) store_block_meta(row, cols, blk, amax, sum);
  }
}

// store_row_fragment's row (o[n][2 · half + e], normalized by its sum l)
// quantized: head h of token t, this warp's dims from dim0 on. Every lane
// of the warp must call it; `store`: this lane's row is a real head.
template <int NO>
__device__ __forceinline__ void store_row_quantized(const PagedAttention& p,
                                                    const float (&o)[NO][4], int half, float l,
                                                    int64_t t, int64_t h, int64_t dim, int64_t dim0,
                                                    bool store) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float v[NO][2];
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    v[n][0] = o[n][2 * half] * inv;
    v[n][1] = o[n][2 * half + 1] * inv;
  }
  store_quantized_fragment<NO>(quantized_row(p, t), int(p.heads * dim), h * dim + dim0, v, store);
}

}  // namespace tandem::cuda
