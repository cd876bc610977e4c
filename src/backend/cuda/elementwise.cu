// Row-wise and element-wise ops: RMSNorm, gated activations, soft-cap and
// the embedding gather (f32 math, as the CPU backend).
#include <cstdlib>

#include "backend/cuda/activations.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"  // bf16_bits: nearest-even rounding, as core/dtype.h's f32_to_bf16
#include "backend/cuda/reduce.h"

namespace tandem::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void rmsnorm_kernel(const float* x, const float* __restrict__ w, int64_t dim, float eps,
                               float* __restrict__ y, uint16_t* __restrict__ y_bf16) {
  pdl_launch_dependents();
  pdl_wait();
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
  uint16_t* br = y_bf16 ? y_bf16 + int64_t(blockIdx.x) * dim : nullptr;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = xr[i] * r * (w ? w[i] : 1.f);
    yr[i] = v;
    if (br) br[i] = uint16_t(bf16_bits(v));
  }
}

// The one gated activation: out[r, i] = act(gate[r, i]) · up[r, i] over rows
// of `dim` with their own strides (in place allowed: out == gate). Grid:
// (chunks of the row, rows), so one token's wide MLP still fills the GPU.
template <int Act>
__device__ __forceinline__ float gate_act(float g, float u) {
  return (Act == 0 ? silu(g) : gelu_tanh(g)) * u;
}

// out[r, i] = act(gate[r, i]) · up[r, i] (and its bf16 copy), a thread per
// VEC consecutive values: VEC = 4 (16-byte loads and stores) where every row
// start is 16-byte aligned, which llama-3.2-1b's 4,096-token prefill (f32
// gate and up halves of 8,192 values a row) read at 61% of the H200's
// bandwidth one value a thread.
template <int Act, int VEC>
__global__ void gated_kernel(const float* gate, int64_t gate_stride, const float* up,
                             int64_t up_stride, float* out, int64_t out_stride, int64_t dim,
                             uint16_t* __restrict__ out_bf16) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t r = blockIdx.y;
  const int64_t i = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * VEC;
  if (i >= dim) return;
  if constexpr (VEC == 4) {
    const float4 g = *reinterpret_cast<const float4*>(gate + r * gate_stride + i);
    const float4 u = *reinterpret_cast<const float4*>(up + r * up_stride + i);
    const float4 v = make_float4(gate_act<Act>(g.x, u.x), gate_act<Act>(g.y, u.y),
                                 gate_act<Act>(g.z, u.z), gate_act<Act>(g.w, u.w));
    *reinterpret_cast<float4*>(out + r * out_stride + i) = v;
    if (out_bf16)
      *reinterpret_cast<uint2*>(out_bf16 + r * out_stride + i) =
          make_uint2(bf16_bits(v.x) | bf16_bits(v.y) << 16, bf16_bits(v.z) | bf16_bits(v.w) << 16);
  } else {
    const float v = gate_act<Act>(gate[r * gate_stride + i], up[r * up_stride + i]);
    out[r * out_stride + i] = v;
    if (out_bf16) out_bf16[r * out_stride + i] = uint16_t(bf16_bits(v));
  }
}

// The 4-value path of gated_kernel where the rows allow it, unless
// TANDEM_CUDA_GATED_VEC4=0 (read at each launch, for tests and measuring).
bool gated_vec4_enabled() {
  return !env_is("TANDEM_CUDA_GATED_VEC4", "0");
}

template <int Act>
void gated(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride, float* out,
           int64_t out_stride, int64_t rows, int64_t dim, cudaStream_t stream,
           uint16_t* out_bf16 = nullptr) {
  if (rows <= 0 || dim <= 0) return;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = gated_vec4_enabled() && dim % 4 == 0 && gate_stride % 4 == 0 &&
                   up_stride % 4 == 0 && out_stride % 4 == 0 && aligned(gate) && aligned(up) &&
                   aligned(out) && (!out_bf16 || reinterpret_cast<uintptr_t>(out_bf16) % 8 == 0);
  const int64_t per_block = kThreads * (vec ? 4 : 1);
  const dim3 grid(unsigned((dim + per_block - 1) / per_block), unsigned(rows));
  if (vec)
    launch(gated_kernel<Act, 4>, grid, kThreads, 0, stream, gate, gate_stride, up, up_stride, out,
           out_stride, dim, out_bf16);
  else
    launch(gated_kernel<Act, 1>, grid, kThreads, 0, stream, gate, gate_stride, up, up_stride, out,
           out_stride, dim, out_bf16);
  CUDA_CHECK(cudaGetLastError());
}

__global__ void softcap_kernel(float* __restrict__ x, int64_t n, float cap) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void embed_kernel(const uint16_t* __restrict__ table, int64_t dim,
                             const int32_t* __restrict__ ids, float scale,
                             float* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  const uint16_t* row = table + int64_t(ids[blockIdx.x]) * dim;
  float* o = out + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads)
    o[i] = __uint_as_float(uint32_t(row[i]) << 16) * scale;
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t n,
                                int64_t dim) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n * dim;
       i += int64_t(gridDim.x) * kThreads)
    y[i] += b[i % dim];
}

__global__ void add_kernel(float* __restrict__ y, const float* x, int64_t n) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    y[i] += x[i];
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float s) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    x[i] *= s;
}

__global__ void embed_f32_kernel(const float* __restrict__ table, int64_t dim,
                                 const int32_t* __restrict__ ids, float scale,
                                 float* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  const float* row = table + int64_t(ids[blockIdx.x]) * dim;
  float* o = out + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) o[i] = row[i] * scale;
}

__global__ void gather_kernel(const float* src, const int32_t* idx, int64_t dim,
                              float* __restrict__ dst) {
  pdl_launch_dependents();
  pdl_wait();
  const float* r = src + int64_t(idx[blockIdx.x]) * dim;
  float* o = dst + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) o[i] = r[i];
}

__global__ void scatter_kernel(const float* src, const int32_t* idx, int64_t dim,
                               float* __restrict__ dst) {
  pdl_launch_dependents();
  pdl_wait();
  const float* r = src + int64_t(blockIdx.x) * dim;
  float* o = dst + int64_t(idx[blockIdx.x]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) o[i] = r[i];
}

__global__ void add_then_scale_kernel(float* __restrict__ y, const float* x, int64_t n, float s) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads)
    y[i] = (y[i] + x[i]) * s;
}

// residual_norm with the row in registers (dim ≤ kRowThreads · PER): one
// read of h and delta, where the loop version below reads them again per
// pass — the op sits between every two projections, so its latency counts:
// the norm weights (never written) are loaded before the PDL wait.
constexpr int kRowThreads = 512;
template <int PER>
__global__ void __launch_bounds__(kRowThreads)
    residual_norm_regs_kernel(float* __restrict__ h, const float* delta,
                              const float* __restrict__ delta_w, const float* __restrict__ next_w,
                              float* __restrict__ x, int64_t dim, float eps, float h_scale,
                              uint16_t* __restrict__ x_bf16, uint16_t* __restrict__ h_bf16) {
  pdl_launch_dependents();
  float dwv[PER], nwv[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int64_t k = threadIdx.x + int64_t(i) * kRowThreads;
    dwv[i] = delta_w && k < dim ? __ldg(delta_w + k) : 1.f;
    nwv[i] = next_w && k < dim ? __ldg(next_w + k) : 1.f;
  }
  pdl_wait();
  __shared__ float partial[kRowThreads / 32];
  float* hr = h + int64_t(blockIdx.x) * dim;
  const float* dr = delta + int64_t(blockIdx.x) * dim;
  float hv[PER], dv[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int64_t k = threadIdx.x + int64_t(i) * kRowThreads;
    hv[i] = k < dim ? hr[k] : 0.f;
    dv[i] = k < dim ? dr[k] : 0.f;
  }
  float r = 1.f;
  if (delta_w) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) ss += dv[i] * dv[i];
    r = rsqrtf(block_sum<kRowThreads>(ss, partial) / float(dim) + eps);
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int64_t k = threadIdx.x + int64_t(i) * kRowThreads;
    if (k >= dim) break;
    hv[i] = (hv[i] + (delta_w ? dv[i] * r * dwv[i] : dv[i])) * h_scale;
    hr[k] = hv[i];
    if (h_bf16) h_bf16[int64_t(blockIdx.x) * dim + k] = uint16_t(bf16_bits(hv[i]));
    ss += hv[i] * hv[i];
  }
  if (!x) return;
  const float r2 = rsqrtf(block_sum<kRowThreads>(ss, partial) / float(dim) + eps);
  float* xr = x + int64_t(blockIdx.x) * dim;
  uint16_t* br = x_bf16 ? x_bf16 + int64_t(blockIdx.x) * dim : nullptr;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int64_t k = threadIdx.x + int64_t(i) * kRowThreads;
    if (k >= dim) break;
    const float v = hv[i] * r2 * nwv[i];
    xr[k] = v;
    if (br) br[k] = uint16_t(bf16_bits(v));
  }
}

__global__ void residual_norm_kernel(float* __restrict__ h, const float* delta,
                                     const float* __restrict__ delta_w,
                                     const float* __restrict__ next_w, float* __restrict__ x,
                                     int64_t dim, float eps, float h_scale,
                                     uint16_t* __restrict__ x_bf16, uint16_t* __restrict__ h_bf16) {
  pdl_launch_dependents();
  pdl_wait();
  __shared__ float partial[kThreads / 32];
  float* hr = h + int64_t(blockIdx.x) * dim;
  const float* dr = delta + int64_t(blockIdx.x) * dim;
  float r = 1.f;
  if (delta_w) {
    float ss = 0.f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += dr[i] * dr[i];
    r = rsqrtf(block_sum<kThreads>(ss, partial) / float(dim) + eps);
  }
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = (hr[i] + (delta_w ? dr[i] * r * delta_w[i] : dr[i])) * h_scale;
    hr[i] = v;
    if (h_bf16) h_bf16[int64_t(blockIdx.x) * dim + i] = uint16_t(bf16_bits(v));
    ss += v * v;
  }
  if (!x) return;
  const float r2 = rsqrtf(block_sum<kThreads>(ss, partial) / float(dim) + eps);
  float* xr = x + int64_t(blockIdx.x) * dim;
  uint16_t* br = x_bf16 ? x_bf16 + int64_t(blockIdx.x) * dim : nullptr;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float v = hr[i] * r2 * (next_w ? next_w[i] : 1.f);
    xr[i] = v;
    if (br) br[i] = uint16_t(bf16_bits(v));
  }
}

__global__ void add_halves_kernel(const float* src, int64_t half, float* __restrict__ dst) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < half;
       i += int64_t(gridDim.x) * kThreads)
    dst[i] = src[i] + src[half + i];
}

__global__ void split_bf16_kernel(const float* src, int64_t n, uint16_t* __restrict__ hi,
                                  uint16_t* __restrict__ lo) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kThreads) {
    const uint16_t h = uint16_t(bf16_bits(src[i]));
    hi[i] = h;
    if (lo) lo[i] = uint16_t(bf16_bits(src[i] - bf16_value(h)));
  }
}

__global__ void sleep_kernel(uint64_t ns) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= ns) break;
    __nanosleep(1000);
  }
}

}  // namespace

void add_bias(float* y, const float* b, int64_t n, int64_t dim, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  launch(add_bias_kernel, blocks_for(n * dim), kThreads, 0, stream, y, b, n, dim);
  CUDA_CHECK(cudaGetLastError());
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch(add_kernel, blocks_for(n), kThreads, 0, stream, y, x, n);
  CUDA_CHECK(cudaGetLastError());
}

void scale_inplace(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  launch(scale_kernel, blocks_for(n), kThreads, 0, stream, x, n, s);
  CUDA_CHECK(cudaGetLastError());
}

void embed_rows_f32(const float* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                    float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch(embed_f32_kernel, unsigned(n), kThreads, 0, stream, table, dim, ids, scale, out);
  CUDA_CHECK(cudaGetLastError());
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y,
             cudaStream_t stream, uint16_t* y_bf16) {
  if (n <= 0) return;
  launch(rmsnorm_kernel, unsigned(n), kThreads, 0, stream, x, w, dim, eps, y, y_bf16);
  CUDA_CHECK(cudaGetLastError());
}

void silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  gated<0>(gate, n, up, n, gate, n, 1, n, stream);
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  gated<1>(gate, n, up, n, gate, n, 1, n, stream);
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return;
  launch(softcap_kernel, blocks_for(n), kThreads, 0, stream, x, n, cap);
  CUDA_CHECK(cudaGetLastError());
}

void embed_rows_bf16(const uint16_t* table, int64_t dim, const int32_t* ids, int64_t n, float scale,
                     float* out, cudaStream_t stream) {
  if (n <= 0) return;
  launch(embed_kernel, unsigned(n), kThreads, 0, stream, table, dim, ids, scale, out);
  CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const float* src, const int32_t* idx, int64_t n, int64_t dim, float* dst,
                 cudaStream_t stream) {
  if (n <= 0) return;
  launch(gather_kernel, unsigned(n), kThreads, 0, stream, src, idx, dim, dst);
  CUDA_CHECK(cudaGetLastError());
}

void scatter_rows(const float* src, const int32_t* idx, int64_t n, int64_t dim, float* dst,
                  cudaStream_t stream) {
  if (n <= 0) return;
  launch(scatter_kernel, unsigned(n), kThreads, 0, stream, src, idx, dim, dst);
  CUDA_CHECK(cudaGetLastError());
}

void add_then_scale(float* y, const float* x, int64_t n, float s, cudaStream_t stream) {
  if (n <= 0) return;
  launch(add_then_scale_kernel, blocks_for(n), kThreads, 0, stream, y, x, n, s);
  CUDA_CHECK(cudaGetLastError());
}

void gelu_tanh_mul_strided(float* gate, const float* up, int64_t up_stride, int64_t rows,
                           int64_t dim, cudaStream_t stream, uint16_t* gate_bf16) {
  gated<1>(gate, dim, up, up_stride, gate, dim, rows, dim, stream, gate_bf16);
}

void silu_mul_strided(float* gate, const float* up, int64_t up_stride, int64_t rows, int64_t dim,
                      cudaStream_t stream, uint16_t* gate_bf16) {
  gated<0>(gate, dim, up, up_stride, gate, dim, rows, dim, stream, gate_bf16);
}

void split_bf16(const float* src, int64_t n, uint16_t* hi, uint16_t* lo, cudaStream_t stream) {
  if (n <= 0) return;
  launch(split_bf16_kernel, blocks_for(n), kThreads, 0, stream, src, n, hi, lo);
  CUDA_CHECK(cudaGetLastError());
}

void residual_norm(float* h, const float* delta, const float* delta_w, const float* next_w,
                   float* x, int64_t n, int64_t dim, float eps, cudaStream_t stream, float h_scale,
                   uint16_t* x_bf16, uint16_t* h_bf16) {
  if (n <= 0) return;
  const int64_t per = (dim + kRowThreads - 1) / kRowThreads;
  const unsigned rows = unsigned(n);
  const auto go = [&](auto kernel, int threads) {
    launch(kernel, rows, threads, 0, stream, h, delta, delta_w, next_w, x, dim, eps, h_scale,
           x_bf16, h_bf16);
  };
  if (per <= 2)
    go(residual_norm_regs_kernel<2>, kRowThreads);
  else if (per <= 3)  // the Gemmas' 1,152 and 1,536
    go(residual_norm_regs_kernel<3>, kRowThreads);
  else if (per <= 4)
    go(residual_norm_regs_kernel<4>, kRowThreads);
  else if (per <= 8)
    go(residual_norm_regs_kernel<8>, kRowThreads);
  else if (per <= 16)
    go(residual_norm_regs_kernel<16>, kRowThreads);
  else
    go(residual_norm_kernel, kThreads);
  CUDA_CHECK(cudaGetLastError());
}

void silu_mul_halves(const float* gu, int64_t n, int64_t F, float* out, cudaStream_t stream,
                     uint16_t* out_bf16) {
  gated<0>(gu, 2 * F, gu + F, 2 * F, out, F, n, F, stream, out_bf16);
}

void gelu_tanh_mul_halves(const float* gu, int64_t n, int64_t F, float* out, cudaStream_t stream,
                          uint16_t* out_bf16) {
  gated<1>(gu, 2 * F, gu + F, 2 * F, out, F, n, F, stream, out_bf16);
}

void add_halves(const float* src, int64_t half, float* dst, cudaStream_t stream) {
  if (half <= 0) return;
  launch(add_halves_kernel, blocks_for(half), kThreads, 0, stream, src, half, dst);
  CUDA_CHECK(cudaGetLastError());
}

void device_sleep(uint64_t ns, cudaStream_t stream) {
  sleep_kernel<<<1, 1, 0, stream>>>(ns);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
