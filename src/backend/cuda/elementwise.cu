// Row-wise and element-wise ops: RMSNorm, gated activations, soft-cap and
// the embedding gather (f32 math, as the CPU backend).
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               int64_t dim, float eps, float* __restrict__ y) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) s += xr[i] * xr[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const float r = rsqrtf(partial[0] / float(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = xr[i] * r * (w ? w[i] : 1.f);
}

__device__ __forceinline__ float silu(float v) {
  return v / (1.f + __expf(-v));
}

__device__ __forceinline__ float gelu_tanh(float v) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * v * (1.f + tanhf(k * (v + 0.044715f * v * v * v)));
}

template <int Act>
__global__ void gated_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const float g = gate[i];
    gate[i] = (Act == 0 ? silu(g) : gelu_tanh(g)) * up[i];
  }
}

__global__ void softcap_kernel(float* __restrict__ x, int64_t n, float cap) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void embed_kernel(const uint16_t* __restrict__ table, int64_t dim,
                             const int32_t* __restrict__ ids, float scale,
                             float* __restrict__ out) {
  const uint16_t* row = table + int64_t(ids[blockIdx.x]) * dim;
  float* o = out + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads)
    o[i] = __uint_as_float(uint32_t(row[i]) << 16) * scale;
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t n,
                                int64_t dim) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n * dim;
       i += int64_t(gridDim.x) * kThreads)
    y[i] += b[i % dim];
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    y[i] += x[i];
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    x[i] *= s;
}

__global__ void embed_f32_kernel(const float* __restrict__ table, int64_t dim,
                                 const int32_t* __restrict__ ids, float scale,
                                 float* __restrict__ out) {
  const float* row = table + int64_t(ids[blockIdx.x]) * dim;
  float* o = out + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) o[i] = row[i] * scale;
}

}  // namespace

void add_bias(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  add_bias_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(y, b, n, dim);
  CUDA_CHECK(cudaGetLastError());
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n);
  CUDA_CHECK(cudaGetLastError());
}

void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, s);
  CUDA_CHECK(cudaGetLastError());
}

void embed_rows_f32(const float* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                    float* out, cudaStream_t stream) {
  if (n <= 0) return;
  embed_f32_kernel<<<unsigned(n), kThreads, 0, stream>>>(table, dim, ids, scale, out);
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t stream) {
  if (n <= 0) return;
  rmsnorm_kernel<<<unsigned(n), kThreads, 0, stream>>>(x, w, dim, eps, y);
  CUDA_CHECK(cudaGetLastError());
}

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gated_kernel<0><<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n);
  CUDA_CHECK(cudaGetLastError());
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gated_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n);
  CUDA_CHECK(cudaGetLastError());
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return;
  softcap_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, cap);
  CUDA_CHECK(cudaGetLastError());
}

void embed_rows_bf16(const uint16_t* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                     float* out, cudaStream_t stream) {
  if (n <= 0) return;
  embed_kernel<<<unsigned(n), kThreads, 0, stream>>>(table, dim, ids, scale, out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
