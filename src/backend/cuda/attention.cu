// Paged attention, RoPE and the KV write: the attention half of a decoder
// layer on the GPU, with the CPU backend's semantics (backend/cuda/kernels.h).
#include <cfloat>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxDimsPerLane = 16;  // head_dim ≤ 512

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void attention_kernel(const float* __restrict__ q, int64_t pos0, PagedAttention p,
                                 float* __restrict__ out) {
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int64_t kvh = h / (p.heads / p.kv_heads);
  const int64_t kv_dim = p.kv_heads * p.head_dim, q_dim = p.heads * p.head_dim;
  const int64_t block_floats = p.block_size * kv_dim;
  const int64_t pos = pos0 + t;
  const int64_t first = p.window > 0 ? (pos - p.window + 1 > 0 ? pos - p.window + 1 : 0) : 0;
  const int64_t end = p.key_end ? p.key_end[t] : pos + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int dims = int((p.head_dim + 31) / 32);  // per lane: lane, lane + 32, ...

  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  const float* qh = q + t * q_dim + h * p.head_dim;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = i < dims && d < p.head_dim ? qh[d] : 0.f;
    acc[i] = 0.f;
  }
  float m = -FLT_MAX, l = 0.f;
  for (int64_t j = first + warp; j < end; j += kWarps) {
    const int64_t off = int64_t(p.blocks[j / p.block_size - p.first_block]) * block_floats +
                        (j % p.block_size) * kv_dim + kvh * p.head_dim;
    const float* k = p.k_base + off;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (i < dims && d < p.head_dim) s += qv[i] * k[d];
    }
    s = warp_sum(s) * p.scale;
    if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    const float m_new = fmaxf(m, s);
    const float correction = expf(m - m_new), w = expf(s - m_new);
    l = l * correction + w;
    const float* v = p.v_base + off;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (i < dims && d < p.head_dim) acc[i] = acc[i] * correction + w * v[d];
    }
    m = m_new;
  }
  // Merge the warps' partial softmaxes.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float so[kWarps][kMaxDimsPerLane * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) so[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float gm = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) gm = fmaxf(gm, sm[w]);
  float gl = 0.f;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.f) gl += sl[w] * expf(sm[w] - gm);
  float* oh = out + t * q_dim + h * p.head_dim;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.f) o += so[w][d] * expf(sm[w] - gm);
    oh[d] = o / gl;
  }
}

__global__ void rope_kernel(float* __restrict__ x, int64_t heads, int64_t head_dim,
                            const int64_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, int64_t half, float scaling) {
  const int64_t t = blockIdx.x;
  const float pos = float(positions[t]);
  for (int64_t k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    const float angle = pos * inv_freq[i];
    float sn, cs;
    sincosf(angle, &sn, &cs);
    cs *= scaling;
    sn *= scaling;
    float* v = x + (t * heads + h) * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * cs - b * sn;
    v[i + half] = b * cs + a * sn;
  }
}

__global__ void kv_write_kernel(const float* __restrict__ rows, int64_t pos0, int64_t kv_dim,
                                float* __restrict__ base, const int32_t* __restrict__ blocks,
                                int64_t first_block, int64_t block_size) {
  const int64_t t = blockIdx.x, pos = pos0 + t;
  float* dst = base + int64_t(blocks[pos / block_size - first_block]) * block_size * kv_dim +
               (pos % block_size) * kv_dim;
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) dst[i] = rows[t * kv_dim + i];
}

}  // namespace

void attention_paged(const float* q, int64_t pos0, int64_t n, const PagedAttention& p, float* out,
                     cudaStream_t stream) {
  if (n <= 0) return;
  if (p.head_dim > 32 * kMaxDimsPerLane || p.kv_heads <= 0 || p.heads % p.kv_heads != 0)
    fail("attention_paged: head_dim %lld (at most %d) and heads %lld / kv_heads %lld unsupported",
         (long long)p.head_dim, 32 * kMaxDimsPerLane, (long long)p.heads, (long long)p.kv_heads);
  attention_kernel<<<unsigned(n * p.heads), kWarps * 32, 0, stream>>>(q, pos0, p, out);
  CUDA_CHECK(cudaGetLastError());
}

void rope_rotate_half(float* x, int64_t n, int64_t heads, int64_t head_dim,
                      const int64_t* positions, const float* inv_freq, int64_t rotary_dim,
                      float scaling, cudaStream_t stream) {
  if (n <= 0 || rotary_dim <= 0) return;
  rope_kernel<<<unsigned(n), 128, 0, stream>>>(x, heads, head_dim, positions, inv_freq,
                                               rotary_dim / 2, scaling);
  CUDA_CHECK(cudaGetLastError());
}

void kv_write(const float* rows, int64_t pos0, int64_t n, int64_t kv_dim, float* base,
              const int32_t* blocks, int64_t first_block, int64_t block_size, cudaStream_t stream) {
  if (n <= 0) return;
  kv_write_kernel<<<unsigned(n), 128, 0, stream>>>(rows, pos0, kv_dim, base, blocks, first_block,
                                                   block_size);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
