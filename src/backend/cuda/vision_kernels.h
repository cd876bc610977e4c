// Kernels the vision towers need beyond the decoder's (model/vision_ops.h
// states each op's contract; the CPU's backend/cpu is the reference). All
// f32, enqueued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda {

// y[t] = (x[t] - mean) / sqrt(var + eps) · w + b over n rows of dim (in
// place allowed).
void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
               float* y, cudaStream_t stream);
// x[i] = act(x[i]) · up[i] (up null: act(x[i])); act 0 SiLU, 1 GELU (tanh
// approximation), 2 GELU (erf).
void vision_activate(int act, float* x, const float* up, int64_t n, cudaStream_t stream);
// x[i] = min(max(x[i], lo), hi)
void clamp(float* x, int64_t n, float lo, float hi, cudaStream_t stream);
// x[t, j] = (x[t, j] · mul - sub[j]) · div[j] (sub null: x · mul)
void scale_shift(float* x, int64_t n, int64_t dim, float mul, const float* sub, const float* div,
                 cudaStream_t stream);
// VisionOps::rope: rotate-half RoPE of [n, heads, head_dim] in `segments`
// parts, angles from cos/sin [n, head_dim / 2].
void rope_table(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t segments,
                const float* cos, const float* sin, cudaStream_t stream);
// VisionOps::pool_grid and merge_grid.
void pool_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k, float* y,
               cudaStream_t stream);
void merge_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t m, float* y,
                cudaStream_t stream);
// Rows of `dim` f32 values as three bf16 parts side by side, dst [rows,
// 3·dim]: (hi, lo, hi) when lo_second, else (hi, hi, lo). A product of two
// such operands over 3·dim columns is hi·hi + lo·hi + hi·lo (16 significant
// bits) in one GEMM.
void split_rows3(const float* src, int64_t rows, int64_t dim, bool lo_second, uint16_t* dst,
                 cudaStream_t stream);
// p[r] = softmax(s[r]) over rows of `cols` scores, written as bf16 hi and
// lo parts (p = hi + lo to 16 significant bits) for the tensor-core P · V.
void softmax_rows_split(const float* s, int64_t rows, int64_t cols, uint16_t* hi, uint16_t* lo,
                        cudaStream_t stream);

}  // namespace tandem::cuda
