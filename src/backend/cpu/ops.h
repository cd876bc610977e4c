// Element-wise and attention ops of the CPU backend (f32 activations).
// Contract: all math in f32; softmax subtracts the row max first.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace tandem::cpu {

// y[t] = x[t] · rsqrt(mean(x[t]²) + eps) · w  for each of n rows of `dim`
// floats (in place allowed). w already includes Gemma's +1; null w means
// no weight (Gemma 4's v_norm).
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y);

// y[t] = (x[t] - mean) / sqrt(var + eps) · w + b over n rows of `dim` (in place allowed).
void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
               float* y);

// x[i] = gelu_tanh(x[i]); gelu_erf: the exact GELU, x · Φ(x)
void gelu_tanh(float* x, int64_t n);
void gelu_erf(float* x, int64_t n);

// gate[i] = act(gate[i]) · up[i] for i < n.
void silu_mul(float* gate, const float* up, int64_t n);
void gelu_tanh_mul(float* gate, const float* up, int64_t n);
void gelu_erf_mul(float* gate, const float* up, int64_t n);

// x[i] = cap · tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

struct AttentionParams {
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // K; query head h reads kv head h / (H / K)
  int64_t head_dim = 0;  // Dh
  float scale = 1.0f;    // multiplies q·k
  float softcap = 0.0f;  // 0 = off
  int64_t window =
      0;  // 0 = every earlier position; else the last `window` positions, self included
  // Paged K/V: position p lives in row p % block_size of block
  // blocks[p / block_size - first_block]; a block is [block_size, K·Dh] at
  // k_base / v_base + block * block_size * K·Dh.
  const float* k_base = nullptr;
  const float* v_base = nullptr;
  const int32_t* blocks = nullptr;
  int64_t first_block = 0;
  int64_t block_size = 0;
  // Optional, [n]: query t sees keys below key_end[t] instead of pos + 1
  // (bidirectional attention within an image); the window still applies.
  const int64_t* key_end = nullptr;
};

// Causal attention of n new tokens at positions pos0 .. pos0+n-1 of one
// sequence, whose keys and values are already in its blocks.
//   q: [n, H·Dh]   out: [n, H·Dh]
void attention(ThreadPool& pool, const float* q, int64_t pos0, int64_t n, const AttentionParams& p,
               float* out);

}  // namespace tandem::cpu
