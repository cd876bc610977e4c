// Decode GEMV over bf16 weights: the kernel that decides batch-1 decode
// speed, since it streams every weight once per step.
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxBatch = 8;  // batch rows kept in registers per pass

__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 8 weights (one 16-byte load) times 8 activations of batch row t.
template <int N>
__device__ __forceinline__ void fma8(const uint4 w, const float* __restrict__ x, int64_t cols,
                                     int64_t c, float (&acc)[N]) {
  const float w0 = bf16_lo(w.x), w1 = bf16_hi(w.x), w2 = bf16_lo(w.y), w3 = bf16_hi(w.y),
              w4 = bf16_lo(w.z), w5 = bf16_hi(w.z), w6 = bf16_lo(w.w), w7 = bf16_hi(w.w);
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float4* xp = reinterpret_cast<const float4*>(x + t * cols + c);
    const float4 a = __ldg(xp), b = __ldg(xp + 1);
    acc[t] += w0 * a.x + w1 * a.y + w2 * a.z + w3 * a.w + w4 * b.x + w5 * b.y + w6 * b.z + w7 * b.w;
  }
}

// cols % 8 == 0: 16-byte loads. Each warp owns ROWS consecutive output rows
// and reuses every activation chunk it loads for all of them; UNROLL chunks
// per row are in flight at once (memory-level parallelism is what a GEMV
// needs to reach HBM bandwidth).
template <int N, int ROWS, int UNROLL>
__global__ void gemv_bf16_vec(const uint16_t* __restrict__ W, int64_t rows, int64_t cols,
                              const float* __restrict__ x, float* __restrict__ y) {
  const int64_t row0 = (int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32) * ROWS;
  const int lane = threadIdx.x % 32;
  if (row0 >= rows) return;
  const int64_t chunks = cols / 8;
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)  // rows past the end re-read the last row, never stored
    w[r] = reinterpret_cast<const uint4*>(W + (row0 + r < rows ? row0 + r : rows - 1) * cols);
  float acc[ROWS][N];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = 0.f;
  // The first weight loads go out before waiting for the previous kernel
  // (PDL: weights are never written), so they overlap its tail.
  pdl_launch_dependents();
  int64_t i = lane;
  uint4 v[ROWS][UNROLL];
  if (i + 32 * (UNROLL - 1) < chunks) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[r][u] = __ldg(w[r] + i + 32 * u);
  }
  pdl_wait();
  for (; i + 32 * (UNROLL - 1) < chunks; i += 32 * UNROLL) {
    if (i != lane) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[r][u] = __ldg(w[r] + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) fma8<N>(v[r][u], x, cols, (i + 32 * u) * 8, acc[r]);
  }
  for (; i < chunks; i += 32)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) fma8<N>(__ldg(w[r] + i), x, cols, i * 8, acc[r]);
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0 && row0 + r < rows) y[t * rows + row0 + r] = s;
    }
}

// Any cols: one weight at a time (odd shapes only).
__global__ void gemv_bf16_scalar(const uint16_t* __restrict__ W, int64_t rows, int64_t cols,
                                 const float* __restrict__ x, int64_t n, float* __restrict__ y) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const uint16_t* w = W + row * cols;
  for (int64_t t = 0; t < n; ++t) {
    float acc = 0.f;
    for (int64_t c = lane; c < cols; c += 32)
      acc += __uint_as_float(uint32_t(w[c]) << 16) * x[t * cols + c];
    acc = warp_sum(acc);
    if (lane == 0) y[t * rows + row] = acc;
  }
}

// Batch 1: one row per warp, four loads in flight. Larger batches: rows
// share each activation chunk (two or four rows per warp).
template <int N>
void launch_vec(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y,
                cudaStream_t stream) {
  constexpr int kRows = N == 1 ? 1 : N < 4 ? 2 : 4;
  constexpr int kUnroll = N == 1 ? 4 : 2;
  const int64_t per_block = int64_t(kWarpsPerBlock) * kRows;
  const unsigned blocks = unsigned((rows + per_block - 1) / per_block);
  launch(gemv_bf16_vec<N, kRows, kUnroll>, blocks, kWarpsPerBlock * 32, 0, stream, W, rows, cols, x,
         y);
}

// f32 weights: one warp per row, float4 loads (cols % 4 == 0) or scalar.
__global__ void gemv_f32_kernel(const float* __restrict__ W, int64_t rows, int64_t cols,
                                const float* __restrict__ x, int64_t n, float* __restrict__ y,
                                bool vec) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* w = W + row * cols;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    float acc = 0.f;
    if (vec) {
      for (int64_t c = lane; c < cols / 4; c += 32) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(w) + c);
        const float4 b = __ldg(reinterpret_cast<const float4*>(xt) + c);
        acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32) acc += w[c] * xt[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[t * rows + row] = acc;
  }
}

}  // namespace

void gemv_f32(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const unsigned blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch(gemv_f32_kernel, blocks, kWarpsPerBlock * 32, 0, stream, W, rows, cols, x, n, y, vec);
  CUDA_CHECK(cudaGetLastError());
}

void gemv_bf16(const uint16_t* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  const bool aligned = cols % 8 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (!aligned) {
    const unsigned blocks = unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    launch(gemv_bf16_scalar, blocks, kWarpsPerBlock * 32, 0, stream, W, rows, cols, x, n, y);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += kMaxBatch) {
    const int64_t m = n - t0 < kMaxBatch ? n - t0 : kMaxBatch;
    const float* xt = x + t0 * cols;
    float* yt = y + t0 * rows;
    switch (m) {
      case 1: launch_vec<1>(W, rows, cols, xt, yt, stream); break;
      case 2: launch_vec<2>(W, rows, cols, xt, yt, stream); break;
      case 3: launch_vec<3>(W, rows, cols, xt, yt, stream); break;
      case 4: launch_vec<4>(W, rows, cols, xt, yt, stream); break;
      case 5: launch_vec<5>(W, rows, cols, xt, yt, stream); break;
      case 6: launch_vec<6>(W, rows, cols, xt, yt, stream); break;
      case 7: launch_vec<7>(W, rows, cols, xt, yt, stream); break;
      default: launch_vec<8>(W, rows, cols, xt, yt, stream); break;
    }
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
