// The CUDA backend's kernels, as host functions over device pointers, each
// enqueued on `stream` (asynchronous; errors surface at the next check).
// Contracts match the CPU backend's (backend/cpu/kernels.h, ops.h): f32
// activations, bf16 weights widened to f32, f32 accumulation — so every
// kernel is tested against the CPU reference (tests/cuda/).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda {

// y[t, r] = Σ_c W[r, c] · x[t, c] for t < n, r < rows: the decode GEMV
// (n = batch, small). W: [rows, cols] bf16, row-major; x: [n, cols] f32;
// y: [n, rows] f32. One warp per output row streams the row with 16-byte
// loads (when cols % 8 == 0) and keeps up to 8 batch rows in registers.
void gemv_bf16(const uint16_t* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream);

// The same over f32 weights (W: [rows, cols] f32).
void gemv_f32(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream);

// y[t, i] += b[i] for t < n, i < dim.
void add_bias(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t stream);
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
// x[i] *= s
void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream);
// out[t] = table[ids[t]] · scale, f32 rows.
void embed_rows_f32(const float* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                    float* out, cudaStream_t stream);

// y[t] = x[t] · rsqrt(mean(x[t]²) + eps) · w over n rows of dim (in place
// allowed); w already holds Gemma's +1; null w: no weight.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t stream);

// gate[i] = act(gate[i]) · up[i], i < n.
void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);
void gelu_tanh_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);

// x[i] = cap · tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// out[t] = table[ids[t]] · scale (rows of `dim` bf16 widened to f32).
void embed_rows_bf16(const uint16_t* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                     float* out, cudaStream_t stream);

// Paged attention over f32 K/V, the CPU backend's contract (cpu::attention):
// query t (position pos0 + t) sees keys [max(0, pos - window + 1), end) with
// end = key_end[t] or pos + 1; scores are q·k · scale, soft-capped when
// softcap > 0; query head h reads kv head h / (heads / kv_heads). Position p
// lives in row p % block_size of block blocks[p / block_size - first_block].
// All pointers are device pointers. One block per (token, head); each warp
// keeps an online softmax over its share of the keys, merged at the end.
// (Correctness first: long contexts at batch 1 want split-K, not yet.)
struct PagedAttention {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // head_dim ≤ 512
  float scale = 1.f, softcap = 0.f;
  int64_t window = 0;
  const float* k_base = nullptr;
  const float* v_base = nullptr;
  const int32_t* blocks = nullptr;
  int64_t first_block = 0, block_size = 0;
  const int64_t* key_end = nullptr;  // [n] or null
};
// q, out: [n, heads·head_dim].
void attention_paged(const float* q, int64_t pos0, int64_t n, const PagedAttention& p, float* out,
                     cudaStream_t stream);

// Rotate-half RoPE in place on x [n, heads, head_dim] for positions[t]
// (device, [n]): dims i and i + rotary_dim/2 (i < rotary_dim/2) rotate by
// angle = float(pos) · inv_freq[i] (f32, as transformers), cos and sin
// times `scaling`.
void rope_rotate_half(float* x, int64_t n, int64_t heads, int64_t head_dim,
                      const int64_t* positions, const float* inv_freq, int64_t rotary_dim,
                      float scaling, cudaStream_t stream);

// Writes rows [n, kv_dim] for positions pos0 .. pos0+n-1 into paged storage
// (layout as PagedAttention's).
void kv_write(const float* rows, int64_t pos0, int64_t n, int64_t kv_dim, float* base,
              const int32_t* blocks, int64_t first_block, int64_t block_size, cudaStream_t stream);

}  // namespace tandem::cuda
