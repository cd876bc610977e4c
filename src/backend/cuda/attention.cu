// Paged attention, RoPE and the KV write: the attention half of a decoder
// layer on the GPU, with the CPU backend's semantics (backend/cuda/kernels.h).
#include <cfloat>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxDimsPerLane = 16;  // head_dim ≤ 512

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The blocks of token t's sequence for this layer's kind, and the row of
// position j in the paged storage (offset in floats, kv head 0).
__device__ __forceinline__ int64_t kv_offset(const StepLayout& at, int64_t t, int64_t j,
                                             int64_t block_size, int64_t kv_dim) {
  const int64_t s = at.seq[t];
  const int64_t first = at.first_block ? at.first_block[s] : 0;
  const int32_t block = at.tables[at.table_start[s] + (j / block_size - first)];
  return (int64_t(block) * block_size + j % block_size) * kv_dim;
}

// One block per (token, head, split). Each of the 4 warps takes tiles of 32
// keys of the split's range in turn: every lane scores one key (the whole
// q·k dot product, q from shared memory), the warp keeps an online softmax
// over its tiles (one max and one sum reduction per tile), and the values
// are accumulated with each lane owning dims lane, lane + 32, ... . The
// warps merge in shared memory; the result is final (splits == 1) or a
// partial (m, l, unnormalized o) for attention_combine_kernel.
// DPL: head dims per lane (head_dim ≤ 32 · DPL), a compile-time bound so the
// value loop unrolls and keeps its loads in flight together.
template <int DPL>
__global__ void attention_kernel(const float* __restrict__ q, StepLayout at, PagedAttention p,
                                 float* __restrict__ out) {
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int split = int(blockIdx.y);
  const int64_t kvh = h / (p.heads / p.kv_heads);
  const int64_t kv_dim = p.kv_heads * p.head_dim, q_dim = p.heads * p.head_dim;
  const int64_t pos = at.positions[t];
  const int64_t lo = p.window > 0 ? (pos - p.window + 1 > 0 ? pos - p.window + 1 : 0) : 0;
  const int64_t hi = at.key_end[t];
  const int64_t chunk = (hi - lo + p.splits - 1) / p.splits;
  const int64_t first = lo + split * chunk;
  const int64_t end = first + chunk < hi ? first + chunk : hi;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool vec4 = p.head_dim % 4 == 0 && kv_dim % 4 == 0;

  __shared__ float qs[32 * kMaxDimsPerLane];
  const float* qh = q + t * q_dim + h * p.head_dim;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) qs[d] = qh[d];
  __syncthreads();

  float acc[DPL];  // dims lane, lane + 32, ...
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
  float m = -FLT_MAX, l = 0.f;
  for (int64_t base = first + int64_t(warp) * 32; base < end; base += 32 * kWarps) {
    const int64_t j = base + lane;
    const bool valid = j < end;
    const int64_t off = valid ? kv_offset(at, t, j, p.block_size, kv_dim) + kvh * p.head_dim : 0;
    float s = -FLT_MAX;
    if (valid) {
      const float* k = p.k_base + off;
      float dot = 0.f;
      if (vec4) {
#pragma unroll 4
        for (int64_t d = 0; d < p.head_dim; d += 4) {
          const float4 kv = *reinterpret_cast<const float4*>(k + d);
          dot += qs[d] * kv.x + qs[d + 1] * kv.y + qs[d + 2] * kv.z + qs[d + 3] * kv.w;
        }
      } else {
        for (int64_t d = 0; d < p.head_dim; ++d) dot += qs[d] * k[d];
      }
      s = dot * p.scale;
      if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    }
    const float m_new = fmaxf(m, warp_max(s));
    const float w = valid ? expf(s - m_new) : 0.f;
    const float correction = expf(m - m_new);
    l = l * correction + warp_sum(w);
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= correction;
      // All 32 keys of the tile, the missing ones weighted 0 at offset 0, so
      // the loop has a fixed count and its loads overlap.
#pragma unroll 8
    for (int jj = 0; jj < 32; ++jj) {
      const float wj = __shfl_sync(0xffffffffu, w, jj);
      const float* v = p.v_base + __shfl_sync(0xffffffffu, off, jj);
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < p.head_dim) acc[i] += wj * v[d];
      }
    }
    m = m_new;
  }
  // Merge the warps' partial softmaxes.
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float so[kWarps][DPL * 32];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) so[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float gm = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.f) gm = fmaxf(gm, sm[w]);
  float gl = 0.f;
  for (int w = 0; w < kWarps; ++w)
    if (sl[w] > 0.f) gl += sl[w] * expf(sm[w] - gm);
  if (p.splits == 1) {
    float* oh = out + t * q_dim + h * p.head_dim;
    for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
      float o = 0.f;
      for (int w = 0; w < kWarps; ++w)
        if (sl[w] > 0.f) o += so[w][d] * expf(sm[w] - gm);
      oh[d] = o / gl;
    }
    return;
  }
  // Partial: [m, l, o[head_dim]] per (token, head, split).
  float* part = p.partial + ((t * p.heads + h) * p.splits + split) * (p.head_dim + 2);
  if (threadIdx.x == 0) {
    part[0] = gm;
    part[1] = gl;
  }
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w)
      if (sl[w] > 0.f) o += so[w][d] * expf(sm[w] - gm);
    part[2 + d] = o;
  }
}

// Merges the splits of one (token, head): the global max, then the
// rescaled sums. Splits that saw no key have l = 0 and are skipped.
__global__ void attention_combine_kernel(PagedAttention p, float* __restrict__ out) {
  const int64_t th = blockIdx.x;  // t · heads + h
  const float* part = p.partial + th * p.splits * (p.head_dim + 2);
  const int64_t stride = p.head_dim + 2;
  float gm = -FLT_MAX;
  for (int s = 0; s < p.splits; ++s)
    if (part[s * stride + 1] > 0.f) gm = fmaxf(gm, part[s * stride]);
  float gl = 0.f;
  for (int s = 0; s < p.splits; ++s) {
    const float l = part[s * stride + 1];
    if (l > 0.f) gl += l * expf(part[s * stride] - gm);
  }
  float* oh = out + th * p.head_dim;
  for (int64_t d = threadIdx.x; d < p.head_dim; d += blockDim.x) {
    float o = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const float l = part[s * stride + 1];
      if (l > 0.f) o += part[s * stride + 2 + d] * expf(part[s * stride] - gm);
    }
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

// One block per (token, head of q, k or v); 128 threads; the head in shared
// memory between the norm, the rotation and the write.
__global__ void qkv_post_kernel(const float* __restrict__ qkv, StepLayout at, QkvPost p) {
  __shared__ float buf[32 * kMaxDimsPerLane];
  __shared__ float partial[4];
  const int64_t t = blockIdx.x, j = blockIdx.y, Dh = p.head_dim;
  const int64_t Q = p.heads * Dh, KV = p.kv_heads * Dh;
  const int kind = j < p.heads ? 0 : j < p.heads + p.kv_heads ? 1 : 2;  // q, k, v
  const int64_t head = kind == 0 ? j : kind == 1 ? j - p.heads : j - p.heads - p.kv_heads;
  const int64_t col = kind == 0               ? head * Dh
                      : kind == 1 || p.k_eq_v ? Q + head * Dh
                                              : Q + KV + head * Dh;
  const float* src = qkv + t * p.stride + col;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) {
    const float v = src[d];
    buf[d] = v;
    ss += v * v;
  }
  const bool norm = kind == 2 ? p.v_norm : p.qk_norm;
  if (norm) {
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    const float r = rsqrtf((partial[0] + partial[1] + partial[2] + partial[3]) / float(Dh) + p.eps);
    const float* w = kind == 0 ? p.q_norm : kind == 1 ? p.k_norm : nullptr;
    for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) buf[d] = buf[d] * r * (w ? w[d] : 1.f);
  }
  __syncthreads();
  const int64_t pos = at.positions[t];
  if (kind < 2 && p.rotary_dim > 0) {
    const int64_t half = p.rotary_dim / 2;
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      float sn, cs;
      sincosf(float(pos) * p.inv_freq[i], &sn, &cs);
      cs *= p.rope_scaling;
      sn *= p.rope_scaling;
      const float a = buf[i], b = buf[i + half];
      buf[i] = a * cs - b * sn;
      buf[i + half] = b * cs + a * sn;
    }
    __syncthreads();
  }
  float* dst;
  float scale = 1.f;
  if (kind == 0) {
    dst = p.q_out + t * Q + head * Dh;
    if (p.temp_beta != 0.f)
      scale = 1.0f + p.temp_beta * logf(1.0f + floorf(float(pos) / p.temp_base));
  } else {
    dst = (kind == 1 ? p.k_cache : p.v_cache) + kv_offset(at, t, pos, p.block_size, KV) + head * Dh;
  }
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) dst[d] = buf[d] * scale;
}

__global__ void kv_write_kernel(const float* __restrict__ rows, int64_t kv_dim,
                                float* __restrict__ base, int64_t block_size, StepLayout at) {
  const int64_t t = blockIdx.x;
  float* dst = base + kv_offset(at, t, at.positions[t], block_size, kv_dim);
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) dst[i] = rows[t * kv_dim + i];
}

}  // namespace

int attention_splits(int64_t n, int64_t heads, int multiprocessors) {
  const int64_t blocks = n * heads, want = 2 * int64_t(multiprocessors);
  if (blocks >= want) return 1;
  const int64_t s = (want + blocks - 1) / blocks;
  return int(s < 32 ? s : 32);
}

size_t attention_partial_floats(int64_t n, int64_t heads, int64_t head_dim, int splits) {
  return splits > 1 ? size_t(n * heads * splits * (head_dim + 2)) : 0;
}

void attention_paged(const float* q, int64_t n, const StepLayout& at, const PagedAttention& p,
                     float* out, cudaStream_t stream) {
  if (n <= 0) return;
  if (p.head_dim > 32 * kMaxDimsPerLane || p.kv_heads <= 0 || p.heads % p.kv_heads != 0 ||
      p.splits < 1 || (p.splits > 1 && !p.partial))
    fail(
        "attention_paged: head_dim %lld (at most %d), heads %lld / kv_heads %lld, splits %d "
        "unsupported",
        (long long)p.head_dim, 32 * kMaxDimsPerLane, (long long)p.heads, (long long)p.kv_heads,
        p.splits);
  const dim3 grid(unsigned(n * p.heads), unsigned(p.splits));
  if (p.head_dim <= 32)
    attention_kernel<1><<<grid, kWarps * 32, 0, stream>>>(q, at, p, out);
  else if (p.head_dim <= 64)
    attention_kernel<2><<<grid, kWarps * 32, 0, stream>>>(q, at, p, out);
  else if (p.head_dim <= 128)
    attention_kernel<4><<<grid, kWarps * 32, 0, stream>>>(q, at, p, out);
  else if (p.head_dim <= 256)
    attention_kernel<8><<<grid, kWarps * 32, 0, stream>>>(q, at, p, out);
  else
    attention_kernel<16><<<grid, kWarps * 32, 0, stream>>>(q, at, p, out);
  CUDA_CHECK(cudaGetLastError());
  if (p.splits == 1) return;
  attention_combine_kernel<<<unsigned(n * p.heads), 128, 0, stream>>>(p, out);
  CUDA_CHECK(cudaGetLastError());
}

void qkv_post(const float* qkv, int64_t n, const StepLayout& at, const QkvPost& p,
              cudaStream_t stream) {
  if (n <= 0) return;
  if (p.head_dim > 32 * kMaxDimsPerLane)
    fail("qkv_post: head_dim %lld (at most %d)", (long long)p.head_dim, 32 * kMaxDimsPerLane);
  const dim3 grid(unsigned(n), unsigned(p.heads + (p.own_kv ? 2 * p.kv_heads : 0)));
  qkv_post_kernel<<<grid, 128, 0, stream>>>(qkv, at, p);
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

void kv_write(const float* rows, int64_t n, int64_t kv_dim, float* base, int64_t block_size,
              const StepLayout& at, cudaStream_t stream) {
  if (n <= 0) return;
  kv_write_kernel<<<unsigned(n), 128, 0, stream>>>(rows, kv_dim, base, block_size, at);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
