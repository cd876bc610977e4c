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

}  // namespace tandem::cuda
