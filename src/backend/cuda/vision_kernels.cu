// The vision towers' own kernels (vision_kernels.h): LayerNorm, plain
// activations, clamps, table-driven RoPE and the patch-grid reshapes. They
// run once per image, not per token, so they are simple grid-stride loops;
// the matmuls and attention dominate an encode. The softmax of attention's
// materialized scores is here too (vision_ops.cpp's attention).
#include "backend/cuda/activations.h"
#include "backend/cuda/check.h"
#include "backend/cuda/mma.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/vision_kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

#define GRID_STRIDE(i, n)                                                 \
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * kThreads)

// One block per row: mean, then the variance around it (two passes, as the
// CPU's, which sums in double; f32 sums of a few thousand values stay
// within 1e-6 relative here).
__global__ void layernorm_kernel(const float* x, const float* __restrict__ w,
                                 const float* __restrict__ b, int64_t dim, float eps, float* y) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) s += xr[i];
  const float mean = block_sum<kThreads>(s, partial) / float(dim);
  float v = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) v += (xr[i] - mean) * (xr[i] - mean);
  const float inv = rsqrtf(block_sum<kThreads>(v, partial) / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

__device__ __forceinline__ float gelu_erf(float v) {
  return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

template <int Act>
__global__ void activate_kernel(float* x, const float* up, int64_t n) {
  GRID_STRIDE(i, n) {
    const float g = x[i];
    const float a = Act == 0 ? silu(g) : Act == 1 ? gelu_tanh(g) : gelu_erf(g);
    x[i] = up ? a * up[i] : a;
  }
}

__global__ void clamp_kernel(float* x, int64_t n, float lo, float hi) {
  GRID_STRIDE(i, n) x[i] = fminf(fmaxf(x[i], lo), hi);
}

__global__ void scale_shift_kernel(float* x, int64_t n, int64_t dim, float mul,
                                   const float* __restrict__ sub, const float* __restrict__ div) {
  GRID_STRIDE(i, n * dim) {
    const float e = x[i] * mul;
    x[i] = sub ? (e - sub[i % dim]) * div[i % dim] : e;
  }
}

// One thread per rotated pair: (token, head, pair j < head_dim / 2).
__global__ void rope_table_kernel(float* x, int64_t n, int64_t heads, int64_t head_dim,
                                  int64_t segments, const float* cos, const float* sin) {
  const int64_t pairs = head_dim / 2, seg_half = pairs / segments;
  GRID_STRIDE(idx, n * heads * pairs) {
    const int64_t j = idx % pairs, row = idx / pairs, t = row / heads;
    const int64_t s = j / seg_half, i = j % seg_half;
    float* e = x + row * head_dim + s * 2 * seg_half;
    const float c = cos[t * pairs + j], sn = sin[t * pairs + j];
    const float a = e[i], b = e[i + seg_half];
    e[i] = a * c - b * sn;
    e[i + seg_half] = b * c + a * sn;
  }
}

// One thread per output value; the k×k inputs summed in the CPU's order.
__global__ void pool_grid_kernel(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k,
                                 float* __restrict__ y) {
  const int64_t pc = cols / k, out = (rows / k) * pc;
  const float inv = 1.0f / float(k * k);
  GRID_STRIDE(idx, out * dim) {
    const int64_t ch = idx % dim, p = idx / dim, r0 = (p / pc) * k, c0 = (p % pc) * k;
    float acc = 0.f;
    for (int64_t r = r0; r < r0 + k; ++r)
      for (int64_t c = c0; c < c0 + k; ++c) acc += inv * x[(r * cols + c) * dim + ch];
    y[idx] = acc;
  }
}

__global__ void merge_grid_kernel(const float* x, int64_t rows, int64_t cols, int64_t dim,
                                  int64_t m, float* __restrict__ y) {
  const int64_t mc = cols / m, M = m * m, width = dim * M;
  GRID_STRIDE(idx, (rows / m) * mc * width) {
    const int64_t block = idx / width, e = idx % width, ch = e / M, ky = (e % M) / m, kx = e % m;
    const int64_t r = block / mc, c = block % mc;
    y[idx] = x[((r * m + ky) * cols + c * m + kx) * dim + ch];
  }
}

__global__ void split_rows3_kernel(const float* src, int64_t rows, int64_t dim, bool lo_second,
                                   uint16_t* __restrict__ dst) {
  GRID_STRIDE(i, rows * dim) {
    const int64_t r = i / dim, d = i % dim;
    const uint32_t h = bf16_bits(src[i]);
    const uint16_t l = uint16_t(bf16_bits(src[i] - bf16_value(h)));
    uint16_t* out = dst + r * 3 * dim + d;
    out[0] = uint16_t(h);
    out[dim] = lo_second ? l : uint16_t(h);
    out[2 * dim] = lo_second ? uint16_t(h) : l;
  }
}

// One block per row: the row's max and Σ exp(s - max) in one pass (each
// thread keeps its own running pair, merged across the block), then the
// normalized values as bf16 hi/lo parts.
__global__ void softmax_rows_split_kernel(const float* s, int64_t cols, uint16_t* __restrict__ hi,
                                          uint16_t* __restrict__ lo) {
  __shared__ float partial[kThreads / 32];
  const float* row = s + int64_t(blockIdx.x) * cols;
  float m = -INFINITY, l = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float v = row[j];
    if (v > m) {
      l = l * __expf(m - v) + 1.f;
      m = v;
    } else {
      l += __expf(v - m);
    }
  }
  float block_max = m;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, o));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = block_max;
  __syncthreads();
  block_max = partial[0];
  for (int w = 1; w < kThreads / 32; ++w) block_max = fmaxf(block_max, partial[w]);
  const float total =
      block_sum<kThreads>(m == -INFINITY ? 0.f : l * __expf(m - block_max), partial);
  const float inv = 1.f / total;
  uint16_t* h = hi + int64_t(blockIdx.x) * cols;
  uint16_t* lw = lo + int64_t(blockIdx.x) * cols;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float p = __expf(row[j] - block_max) * inv;
    const uint32_t hb = bf16_bits(p);
    h[j] = uint16_t(hb);
    lw[j] = uint16_t(bf16_bits(p - bf16_value(hb)));
  }
}

}  // namespace

void layernorm(const float* x, const float* w, const float* b, int64_t n, int64_t dim, float eps,
               float* y, cudaStream_t stream) {
  if (n <= 0) return;
  layernorm_kernel<<<unsigned(n), kThreads, 0, stream>>>(x, w, b, dim, eps, y);
  CUDA_CHECK(cudaGetLastError());
}

void vision_activate(int act, float* x, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (act == 0)
    activate_kernel<0><<<blocks_for(n), kThreads, 0, stream>>>(x, up, n);
  else if (act == 1)
    activate_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(x, up, n);
  else
    activate_kernel<2><<<blocks_for(n), kThreads, 0, stream>>>(x, up, n);
  CUDA_CHECK(cudaGetLastError());
}

void clamp(float* x, int64_t n, float lo, float hi, cudaStream_t stream) {
  if (n <= 0) return;
  clamp_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, lo, hi);
  CUDA_CHECK(cudaGetLastError());
}

void scale_shift(float* x, int64_t n, int64_t dim, float mul, const float* sub, const float* div,
                 cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  scale_shift_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(x, n, dim, mul, sub, div);
  CUDA_CHECK(cudaGetLastError());
}

void rope_table(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t segments,
                const float* cos, const float* sin, cudaStream_t stream) {
  const int64_t total = n * heads * (head_dim / 2);
  if (total <= 0) return;
  rope_table_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, n, heads, head_dim, segments,
                                                                cos, sin);
  CUDA_CHECK(cudaGetLastError());
}

void pool_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t k, float* y,
               cudaStream_t stream) {
  const int64_t total = (rows / k) * (cols / k) * dim;
  if (total <= 0) return;
  pool_grid_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, rows, cols, dim, k, y);
  CUDA_CHECK(cudaGetLastError());
}

void merge_grid(const float* x, int64_t rows, int64_t cols, int64_t dim, int64_t m, float* y,
                cudaStream_t stream) {
  const int64_t total = (rows / m) * (cols / m) * dim * m * m;
  if (total <= 0) return;
  merge_grid_kernel<<<blocks_for(total), kThreads, 0, stream>>>(x, rows, cols, dim, m, y);
  CUDA_CHECK(cudaGetLastError());
}

void split_rows3(const float* src, int64_t rows, int64_t dim, bool lo_second, uint16_t* dst,
                 cudaStream_t stream) {
  if (rows * dim <= 0) return;
  split_rows3_kernel<<<blocks_for(rows * dim), kThreads, 0, stream>>>(src, rows, dim, lo_second,
                                                                      dst);
  CUDA_CHECK(cudaGetLastError());
}

void softmax_rows_split(const float* s, int64_t rows, int64_t cols, uint16_t* hi, uint16_t* lo,
                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  softmax_rows_split_kernel<<<unsigned(rows), kThreads, 0, stream>>>(s, cols, hi, lo);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
