// Pieces of qkv_post's contract (backend/cuda/kernels.h, QkvPost) shared by
// its kernel (attention.cu) and the chunked decode kernel's fused prologue
// (attention_decode_chunked.cu), so the two read the same columns and scale
// by the same temperature. Device code, for the .cu files.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tandem::cuda {

enum QkvKind { kQuery = 0, kKey = 1, kValue = 2 };

// The first column of head `head` of `kind` in a token's projection row:
// q heads, then k heads, then v heads (v reads k's columns when k_eq_v).
__device__ __forceinline__ int64_t qkv_column(const QkvPost& p, int kind, int64_t head) {
  const int64_t Q = p.heads * p.head_dim, KV = p.kv_heads * p.head_dim;
  return kind == kQuery             ? head * p.head_dim
         : kind == kKey || p.k_eq_v ? Q + head * p.head_dim
                                    : Q + KV + head * p.head_dim;
}

// Which head of which kind unit j of a token is: q heads, then k heads,
// then v heads (qkv_post's order).
__device__ __forceinline__ void qkv_head_of(const QkvPost& p, int64_t j, int* kind, int64_t* head) {
  *kind = j < p.heads ? kQuery : j < p.heads + p.kv_heads ? kKey : kValue;
  *head = *kind == kQuery ? j : *kind == kKey ? j - p.heads : j - p.heads - p.kv_heads;
}

// The query temperature at position pos (1 unless temp_beta is set).
__device__ __forceinline__ float query_temperature(const QkvPost& p, int64_t pos) {
  return p.temp_beta != 0.f ? 1.0f + p.temp_beta * logf(1.0f + floorf(float(pos) / p.temp_base))
                            : 1.f;
}

}  // namespace tandem::cuda
