// Paged attention, RoPE and the KV write: the attention half of a decoder
// layer on the GPU, with the CPU backend's semantics (backend/cuda/kernels.h).
#include <algorithm>
#include <cfloat>
#include <cstdlib>

#include "backend/cuda/attention_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/qkv_post.h"
#include "backend/cuda/reduce.h"

namespace tandem::cuda {

namespace {

constexpr int kMaxDimsPerLane = 16;  // head_dim ≤ 512
// qkv_post takes the warp-per-head kernel from this many step tokens on.
constexpr int64_t kWarpPostMinTokens = 8;

// The warp-per-head qkv post (qkv_post_warps_kernel) on steps of many
// tokens, unless TANDEM_CUDA_QKV_POST_WARPS=0 (read at each launch, so a test
// or benchmark can set the block-per-unit kernel against it; 11% faster
// prefill of 4,096 tokens on llama-3.2-1b, bench/results/).
bool qkv_post_warps_enabled() {
  return !env_is("TANDEM_CUDA_QKV_POST_WARPS", "0");
}
constexpr int kMaxSplits = 128;  // key-range splits of one (token, head)

// The blocks of token t's sequence for this layer's kind, and the row of
// position j in the paged storage (offset in floats, kv head 0).
__device__ __forceinline__ int64_t kv_offset(const StepLayout& at, int64_t t, int64_t j,
                                             int64_t block_size, int64_t kv_dim) {
  const int64_t s = at.seq[t];
  const int64_t first = at.first_block ? at.first_block[s] : 0;
  const int32_t block = at.tables[at.table_start[s] + (j / block_size - first)];
  return (int64_t(block) * block_size + j % block_size) * kv_dim;
}

constexpr int kThreads = 128;  // per attention block

// Unit j (a head of q, k or v) of token t in qkv_post's order, resolved from
// what only the step's inputs decide, so both qkv_post kernels can do it
// before waiting for the projection: its kind and head, its first column in
// the token's projection row, the token's position, and where its values go
// (the q output's offset, or the K/V row's in the paged storage).
struct QkvUnit {
  int kind;
  int64_t head, col, pos, dst;
};
__device__ __forceinline__ QkvUnit qkv_unit(const StepLayout& at, const QkvPost& p, int64_t t,
                                            int64_t j) {
  QkvUnit u;
  qkv_head_of(p, j, &u.kind, &u.head);
  u.col = qkv_column(p, u.kind, u.head);
  u.pos = at.positions[t];
  const int64_t Dh = p.head_dim;
  u.dst = u.kind == kQuery ? (t * p.heads + u.head) * Dh
                           : kv_offset(at, t, u.pos, p.block_size, p.kv_heads * Dh) + u.head * Dh;
  return u;
}

// Keys per tile: K and V tiles of tile · head_dim ≤ 4096 floats each.
__host__ __device__ constexpr int tile_keys(int64_t head_dim) {
  return head_dim <= 128 ? 32 : head_dim <= 256 ? 16 : 8;
}
// Four-value loads per thread for one of a tile's K or V (vector path):
// 16 bytes each over f32 rows, 8 over bf16 ones.
constexpr int kTileLoads = 4096 / 4 / kThreads;

// One block of 128 threads per (token, kv head, split, head group): the
// query heads that read the same K/V rows (GQA) share the block, so each row
// is read from memory once — up to 1,024 output values a block; larger
// groups (Gemma 4: 8 heads of 256 or 512) are split over gridDim.z blocks. The split's key range is
// walked in tiles, the next tile's K and V rows loaded into registers while the current one is
// computed:
//  1. the tile's rows go from registers to shared memory;
//  2. the G · tile scores q·k (thread ↔ (head, key); each thread starts its
//     dot product at a dim rotated by its key, so the K reads hit distinct
//     banks);
//  3. one warp per head: the tile's max, the weights exp(s - m) and the
//     online-softmax rescaling of the head's running sum;
//  4. each thread updates the OPT outputs (head, dim) it owns, kept in
//     registers: acc = acc · correction + Σ_key w · v.
// Index math inside the block is 32-bit (64-bit division is emulated and
// was once this kernel's largest cost). The result is final (splits == 1)
// or a partial (m, l, unnormalized o) for attention_combine_kernel. BF16:
// the rows are bf16 (p.kv_bf16), widened to f32 on their way to shared
// memory, so every product is the f32 one over the stored values.
//
// (A version that copies the tiles with cp.async into double buffers and
// splits each score over several lanes for large head dims is the next
// step; it was written but could not yet be run on a GPU.)
template <int OPT, bool BF16>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* q, StepLayout at, PagedAttention p, float* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  // This block's query heads: [g0, g0 + G) of the kv head's group (the
  // group is split over gridDim.z blocks when it is large).
  const int group = int(p.heads / p.kv_heads), per = (group + int(gridDim.z) - 1) / int(gridDim.z);
  const int g0 = int(blockIdx.z) * per, G = min(per, group - g0), Dh = int(p.head_dim);
  const int64_t t = blockIdx.x / p.kv_heads, kvh = blockIdx.x % p.kv_heads;
  const int split = int(blockIdx.y);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t kv_dim = p.kv_heads * Dh, q_dim = p.heads * Dh;
  const int tile = tile_keys(Dh);
  const KeyRange keys = split_keys(at, p, t, split);
  const int64_t first = keys.first, end = keys.end;
  const PagedRows rows = paged_rows(at, p, t, kvh);

  // Shared: q [G][Dh], K and V tiles [tile][Dh], weights [G][tile], and per
  // head m, l and this tile's correction.
  extern __shared__ float shared[];
  float* qs = shared;
  float* ks = qs + G * Dh;
  float* vs = ks + tile * Dh;
  float* ws = vs + tile * Dh;
  float* ms = ws + G * tile;
  float* ls = ms + G;
  float* cs = ls + G;

  const float* qg = q + t * q_dim + (kvh * group + g0) * Dh;
  for (int i = threadIdx.x; i < G * Dh; i += kThreads) qs[i] = qg[i];
  for (int g = threadIdx.x; g < G; g += kThreads) {
    ms[g] = -FLT_MAX;
    ls[g] = 0.f;
  }
  float acc[OPT];
  int out_g[OPT], out_d[OPT];  // the (head, dim) of each output this thread owns
#pragma unroll
  for (int i = 0; i < OPT; ++i) {
    acc[i] = 0.f;
    const int o = threadIdx.x + kThreads * i;
    out_g[i] = o / Dh;
    out_d[i] = o % Dh;
  }
  const bool vec4 = Dh % 4 == 0 && kv_dim % 4 == 0;
  const int per_row = Dh / 4;
  // This thread's pieces of a tile (vector path): key and 16-byte column.
  int piece_key[kTileLoads], piece_col[kTileLoads];
#pragma unroll
  for (int u = 0; u < kTileLoads; ++u) {
    const int i = threadIdx.x + u * kThreads;
    piece_key[u] = vec4 ? i / per_row : tile;
    piece_col[u] = vec4 ? i % per_row : 0;
  }

  // Registers for the next tile (vector path), as stored.
  using Raw = typename KvRaw4<BF16>::type;
  Raw kr[kTileLoads], vr[kTileLoads];
  auto load_tile = [&](int64_t base) {
    const int n = int(end - base < tile ? end - base : tile);
#pragma unroll
    for (int u = 0; u < kTileLoads; ++u) {
      const int key = piece_key[u];
      kr[u] = vr[u] = kv_zero4<BF16>();
      if (key < n) {
        const int64_t off = int64_t(rows.row(base + key)) + 4 * piece_col[u];
        kr[u] = kv_load4<BF16>(p.k_base, off);
        vr[u] = kv_load4<BF16>(p.v_base, off);
      }
    }
  };
  if (vec4 && first < end) load_tile(first);

  for (int64_t base = first; base < end; base += tile) {
    const int n = int(end - base < tile ? end - base : tile);
    __syncthreads();  // the previous tile is consumed (and q is in place)
    // 1. The tile's K and V rows (missing keys: zeros), then the next
    // tile's loads go out.
    if (vec4) {
#pragma unroll
      for (int u = 0; u < kTileLoads; ++u) {
        const int i = threadIdx.x + u * kThreads;
        if (i < tile * per_row) {
          reinterpret_cast<float4*>(ks)[i] = kv_widen(kr[u]);
          reinterpret_cast<float4*>(vs)[i] = kv_widen(vr[u]);
        }
      }
      if (base + tile < end) load_tile(base + tile);
    } else {
      for (int i = threadIdx.x; i < tile * Dh; i += kThreads) {
        const int key = i / Dh, d = i % Dh;
        const int64_t off = key < n ? int64_t(rows.row(base + key)) : -1;
        ks[i] = off >= 0 ? kv_load<BF16>(p.k_base, off + d) : 0.f;
        vs[i] = off >= 0 ? kv_load<BF16>(p.v_base, off + d) : 0.f;
      }
    }
    __syncthreads();
    // 2. Scores.
    for (int pi = threadIdx.x; pi < G * tile; pi += kThreads) {
      const int g = pi / tile, key = pi % tile;
      float s = -FLT_MAX;
      if (key < n) {
        const float* kq = ks + key * Dh;
        const float* qr = qs + g * Dh;
        float dot = 0.f;
        if (vec4) {  // float4 steps, starting at the key's rotation
          int c = key % per_row;
          for (int i = 0; i < per_row; ++i) {
            const float4 a = reinterpret_cast<const float4*>(qr)[c];
            const float4 b = reinterpret_cast<const float4*>(kq)[c];
            dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            if (++c == per_row) c = 0;
          }
        } else {
          int d = key % Dh;
          for (int i = 0; i < Dh; ++i) {
            dot += qr[d] * kq[d];
            if (++d == Dh) d = 0;
          }
        }
        s = dot * p.scale;
        if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
      }
      ws[pi] = s;
    }
    __syncthreads();
    // 3. Online softmax, one warp per head.
    for (int g = warp; g < G; g += kThreads / 32) {
      const float s = lane < n ? ws[g * tile + lane] : -FLT_MAX;
      const float m_old = ms[g];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float w = lane < n ? expf(s - m_new) : 0.f;
      if (lane < tile) ws[g * tile + lane] = w;
      const float sum = warp_sum(w);
      if (lane == 0) {
        const float c = expf(m_old - m_new);
        cs[g] = c;
        ls[g] = ls[g] * c + sum;
        ms[g] = m_new;
      }
    }
    __syncthreads();
    // 4. Values.
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
      if (out_g[i] >= G) break;
      const int g = out_g[i], d = out_d[i];
      const float* w = ws + g * tile;
      float a = acc[i] * cs[g];
      for (int key = 0; key < n; ++key) a += w[key] * vs[key * Dh + d];
      acc[i] = a;
    }
  }
  __syncthreads();
  // Output: final, or this split's partial.
#pragma unroll
  for (int i = 0; i < OPT; ++i) {
    if (out_g[i] >= G) break;
    const int g = out_g[i], d = out_d[i];
    const int64_t h = kvh * group + g0 + g;
    const float l = ls[g];
    if (p.splits == 1) {
      store_out(p, out, t * q_dim + h * Dh + d, l > 0.f ? acc[i] / l : 0.f);
    } else {
      float* part = split_partial(p, t, h, split, Dh);
      if (d == 0) {
        part[0] = ms[g];
        part[1] = l;
      }
      part[2 + d] = acc[i];
    }
  }
}

// Merges the splits of one (token, head), splits ≤ kMaxSplits: the first
// warp reads every split's (m, l) (kMaxSplits / 32 per lane) and leaves each
// split's scale exp(m - max) / Σ l · exp(m - max) (0 for a split that saw
// no key) in shared memory; then every thread sums its dims over the
// splits, 16 loads in flight (one at a time, the L2 latency of each split's
// row was paid in series; this op sits in every layer of a batch-1 step).
__global__ void attention_combine_kernel(PagedAttention p, float* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int kPerLane = kMaxSplits / 32;
  const int64_t th = blockIdx.x;  // t · heads + h
  const int stride = int(p.head_dim) + 2;
  const float* part = split_partial(p, th / p.heads, th % p.heads, 0, p.head_dim);
  __shared__ float scale[kMaxSplits];
  if (threadIdx.x < 32) {
    float m[kPerLane], l[kPerLane];
    float gm = -FLT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int s = int(threadIdx.x) + 32 * i;
      l[i] = s < p.splits ? part[s * stride + 1] : 0.f;
      m[i] = l[i] > 0.f ? part[s * stride] : -FLT_MAX;
      gm = fmaxf(gm, m[i]);
    }
    gm = warp_max(gm);
    float w[kPerLane], gl = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      w[i] = l[i] > 0.f ? expf(m[i] - gm) : 0.f;
      gl += l[i] * w[i];
    }
    gl = warp_sum(gl);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) scale[threadIdx.x + 32 * i] = gl > 0.f ? w[i] / gl : 0.f;
  }
  __syncthreads();
  const int64_t oh = th * p.head_dim;
  constexpr int kBatch = 16;
  static_assert(kMaxSplits % kBatch == 0, "scale[] covers every batch");
  for (int d = threadIdx.x; d < int(p.head_dim); d += blockDim.x) {
    float o = 0.f;
    for (int s = 0; s < p.splits; s += kBatch) {
      float v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        v[i] = s + i < p.splits ? part[(s + i) * stride + 2 + d] : 0.f;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) o += v[i] * scale[s + i];
    }
    store_out(p, out, oh + d, o);
    // A warp's 32 values are 32 consecutive dims of one head (head_dim and
    // blockDim are multiples of 32 where out_quantized is set).
    if (p.out_quantized)
      store_quantized32(quantized_row(p, th / p.heads), int(p.heads * p.head_dim),
                        int((oh % (p.heads * p.head_dim) + d) / 32), o);
  }
}

__global__ void rope_kernel(float* __restrict__ x, int64_t heads, int64_t head_dim,
                            const int64_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, int64_t half, float scaling) {
  pdl_launch_dependents();
  pdl_wait();
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
__global__ void qkv_post_kernel(const float* qkv, StepLayout at, QkvPost p) {
  pdl_launch_dependents();
  __shared__ float buf[32 * kMaxDimsPerLane];
  __shared__ float partial[4];
  const int64_t t = blockIdx.x, Dh = p.head_dim;
  // Before waiting for the projection: what only the step's inputs (in
  // device memory before the step's first kernel) decide — the unit, its
  // destination, and this thread's first rotation angle — so their
  // dependent loads overlap the previous kernel's tail.
  const QkvUnit u = qkv_unit(at, p, t, blockIdx.y);
  const int kind = u.kind;
  const int64_t pos = u.pos;
  const int64_t half = p.rotary_dim / 2;
  float sn0 = 0.f, cs0 = 1.f;
  if (kind < kValue && threadIdx.x < half)
    sincosf(float(pos) * p.inv_freq[threadIdx.x], &sn0, &cs0);
  pdl_wait();
  const float* src = qkv + t * p.stride + u.col;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) {
    const float v = src[d];
    buf[d] = v;
    ss += v * v;
  }
  const bool norm = kind == kValue ? p.v_norm : p.qk_norm;
  if (norm) {
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    const float r = rsqrtf((partial[0] + partial[1] + partial[2] + partial[3]) / float(Dh) + p.eps);
    const float* w = kind == kQuery ? p.q_norm : kind == kKey ? p.k_norm : nullptr;
    for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) buf[d] = buf[d] * r * (w ? w[d] : 1.f);
  }
  __syncthreads();
  if (kind < kValue && p.rotary_dim > 0) {
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      float sn = sn0, cs = cs0;
      if (i != threadIdx.x) sincosf(float(pos) * p.inv_freq[i], &sn, &cs);
      cs *= p.rope_scaling;
      sn *= p.rope_scaling;
      const float a = buf[i], b = buf[i + half];
      buf[i] = a * cs - b * sn;
      buf[i + half] = b * cs + a * sn;
    }
    __syncthreads();
  }
  if (kind == kQuery) {
    float* dst = p.q_out + u.dst;
    const float scale = query_temperature(p, pos);
    for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) dst[d] = buf[d] * scale;
    return;
  }
  void* rows = kind == kKey ? p.k_cache : p.v_cache;
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x)
    kv_store(rows, u.dst + d, buf[d], p.kv_bf16);
}

// qkv_post_kernel's work for steps of many tokens (prefill chunks): a warp
// per (token, head of q, k or v), lane l holding dims l, l + 32, ... (DPL of
// them), so with RoPE over the whole head a rotation pair (i, i + Dh / 2)
// sits in one lane — no shared memory, no block barrier.
// One block per (token, head) of 128 threads, half of them idle at head dim
// 64, took 238 µs a layer for llama-3.2-1b's 4,096-token prefill on the
// H200 (12% of it), 10x its bytes' time.
template <int DPL>
__global__ void qkv_post_warps_kernel(const float* qkv, StepLayout at, QkvPost p, int64_t units) {
  pdl_launch_dependents();
  const int lane = int(threadIdx.x % 32);
  const int64_t unit = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (unit >= units) return;
  const int64_t per_token = p.heads + (p.own_kv ? 2 * p.kv_heads : 0);
  const int64_t t = unit / per_token, Dh = p.head_dim;
  const QkvUnit u = qkv_unit(at, p, t, unit % per_token);
  const int kind = u.kind;
  const int64_t pos = u.pos;
  pdl_wait();
  const float* src = qkv + t * p.stride + u.col;
  float v[DPL];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < DPL; ++k) {
    v[k] = src[lane + 32 * k];
    ss += v[k] * v[k];
  }
  if (kind == kValue ? p.v_norm : p.qk_norm) {
    const float r = rsqrtf(warp_sum(ss) / float(Dh) + p.eps);
    const float* w = kind == kQuery ? p.q_norm : kind == kKey ? p.k_norm : nullptr;
#pragma unroll
    for (int k = 0; k < DPL; ++k) v[k] = v[k] * r * (w ? w[lane + 32 * k] : 1.f);
  }
  if (kind < kValue && p.rotary_dim > 0) {  // over the whole head (qkv_post's condition)
    constexpr int kPairs = DPL / 2;         // a lane rotates dims k and k + kPairs
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      float sn, cs;
      sincosf(float(pos) * p.inv_freq[lane + 32 * k], &sn, &cs);
      cs *= p.rope_scaling;
      sn *= p.rope_scaling;
      const float a = v[k], b = v[k + kPairs];
      v[k] = a * cs - b * sn;
      v[k + kPairs] = b * cs + a * sn;
    }
  }
  if (kind == kQuery) {
    float* dst = p.q_out + u.dst;
    const float scale = query_temperature(p, pos);
#pragma unroll
    for (int k = 0; k < DPL; ++k) dst[lane + 32 * k] = v[k] * scale;
    return;
  }
  void* rows = kind == kKey ? p.k_cache : p.v_cache;
#pragma unroll
  for (int k = 0; k < DPL; ++k) kv_store(rows, u.dst + lane + 32 * k, v[k], p.kv_bf16);
}

__global__ void kv_write_kernel(const float* rows, int64_t kv_dim, void* base, bool bf16,
                                int64_t block_size, StepLayout at) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.x;
  const int64_t dst = kv_offset(at, t, at.positions[t], block_size, kv_dim);
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
    kv_store(base, dst + i, rows[t * kv_dim + i], bf16);
}

template <int OPT, bool BF16>
void launch_attention_typed(dim3 grid, const float* q, const StepLayout& at,
                            const PagedAttention& p, float* out, cudaStream_t stream) {
  const int64_t group = p.heads / p.kv_heads, G = (group + grid.z - 1) / grid.z, Dh = p.head_dim,
                tile = tile_keys(Dh);
  const size_t smem = size_t(G * Dh + 2 * tile * Dh + G * tile + 3 * G) * sizeof(float);
  allow_opt_in_shared_memory(reinterpret_cast<const void*>(attention_kernel<OPT, BF16>));
  if (smem > (size_t(96) << 10))
    fail(
        "attention_paged: %zu bytes of shared memory for %lld heads of dim %lld per kv head "
        "(at most 96 KiB)",
        smem, (long long)G, (long long)Dh);
  launch(attention_kernel<OPT, BF16>, grid, kThreads, smem, stream, q, at, p, out);
}

template <int OPT>
void launch_attention(dim3 grid, const float* q, const StepLayout& at, const PagedAttention& p,
                      float* out, cudaStream_t stream) {
  if (p.kv_bf16)
    launch_attention_typed<OPT, true>(grid, q, at, p, out, stream);
  else
    launch_attention_typed<OPT, false>(grid, q, at, p, out, stream);
}

// The most splits attention_splits hands out: 64 unless
// TANDEM_ATTENTION_MAX_SPLITS says otherwise (for measuring; at most
// kMaxSplits). Measured on the H200 at batch 1 (tok/s at 32 / 64 / 128):
// gemma-4-e2b context 1024 250 / 263 / 256, llama-3.2-1b context 4096
// 750 / 767 / 767, gemma-3-1b context 1024 645 / 638 / 601.
int max_splits() {
  static const int n = [] {
    const char* e = std::getenv("TANDEM_ATTENTION_MAX_SPLITS");
    return e ? std::clamp(std::atoi(e), 1, kMaxSplits) : 64;
  }();
  return n;
}

// The CUDA-core kernel over any rows: per (token, kv head, split) one block
// (or, on a grid that does not fill the device, one per part of a large
// query-head group). `pp` has its block_shift set.
void attention_cuda_cores(const float* q, int64_t n, const StepLayout& at, const PagedAttention& pp,
                          float* out, cudaStream_t stream) {
  const PagedAttention& p = pp;
  // A kv head's query heads share a block up to 1,024 output values
  // (llama's 4 heads of 64, Gemma 3's 4 of 256); on a grid that does not
  // fill the device, Gemma 4's 8 heads of 256 and 512 are split over 2 and 4
  // blocks, which read the same K/V rows (from L2). Measured on the H200: one
  // token over 1,024 keys of a global layer 53 -> 25 us, gemma-4-e2b batch 1
  // 261 -> 321 tok/s; at 32 sequences (a full grid) 3,820 -> 3,645.
  const int64_t group = p.heads / p.kv_heads;
  const bool full_grid =
      p.multiprocessors > 0 && n * p.kv_heads * p.splits >= 2 * int64_t(p.multiprocessors);
  const int64_t blocks_per_group =
      full_grid ? 1 : std::min(group, (group * p.head_dim + 1023) / 1024);
  const int64_t per_block = (group + blocks_per_group - 1) / blocks_per_group;
  // Outputs per thread: the block's heads · head_dim values over the block.
  const int64_t per_thread = (per_block * p.head_dim + kThreads - 1) / kThreads;
  const dim3 grid(unsigned(n * p.kv_heads), unsigned(p.splits), unsigned(blocks_per_group));
  if (per_thread <= 1)
    launch_attention<1>(grid, q, at, pp, out, stream);
  else if (per_thread <= 2)
    launch_attention<2>(grid, q, at, pp, out, stream);
  else if (per_thread <= 4)
    launch_attention<4>(grid, q, at, pp, out, stream);
  else if (per_thread <= 8)
    launch_attention<8>(grid, q, at, pp, out, stream);
  else if (per_thread <= 16)
    launch_attention<16>(grid, q, at, pp, out, stream);
  else if (per_thread <= 32)
    launch_attention<32>(grid, q, at, pp, out, stream);
  else
    fail("attention_paged: %lld query heads of dim %lld per kv head (at most 4096 values)",
         (long long)(p.heads / p.kv_heads), (long long)p.head_dim);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int attention_splits(int64_t n, int64_t kv_heads, int multiprocessors, int blocks_per_sm) {
  const int64_t blocks = n * kv_heads, want = int64_t(blocks_per_sm) * multiprocessors;
  if (blocks >= want) return 1;
  const int64_t s = (want + blocks - 1) / blocks;
  return int(std::min<int64_t>(s, max_splits()));
}
size_t attention_partial_floats(int64_t n, int64_t heads, int64_t head_dim, int splits) {
  return splits > 1 ? size_t(n * heads * splits * (head_dim + 2)) : 0;
}

void attention_paged(const float* q, int64_t n, const StepLayout& at, const PagedAttention& p,
                     float* out, cudaStream_t stream, DecodeKernel kernel,
                     const QkvPost* fused_post) {
  if (n <= 0) return;
  if (p.head_dim > 32 * kMaxDimsPerLane || p.kv_heads <= 0 || p.heads % p.kv_heads != 0 ||
      p.splits < 1 || p.splits > kMaxSplits || (p.splits > 1 && !p.partial))
    fail(
        "attention_paged: head_dim %lld (at most %d), heads %lld / kv_heads %lld, splits %d "
        "(1 to %d) unsupported",
        (long long)p.head_dim, 32 * kMaxDimsPerLane, (long long)p.heads, (long long)p.kv_heads,
        p.splits, kMaxSplits);
  if (p.block_size <= 0 || (p.block_size & (p.block_size - 1)) != 0)
    fail("attention_paged: block_size %lld is not a power of two", (long long)p.block_size);
  PagedAttention pp = p;
  while ((int64_t(1) << pp.block_shift) < p.block_size) ++pp.block_shift;
  // bf16 rows with up to 16 query heads per kv head of dim 64, 128 or 256:
  // the tensor-core kernel (attention_decode.cu), unless told otherwise.
  const bool tensor_cores = kernel == DecodeKernel::TensorCores ||
                            (kernel == DecodeKernel::Auto && attention_decode_mma_supported(pp));
  if (p.out_quantized && !(tensor_cores && attention_quantizes_out(pp)))
    fail(
        "attention_paged: quantized output rows (out_quantized) need the tensor-core decode "
        "kernels and a head dim that is a multiple of 32 (head_dim %lld)",
        (long long)p.head_dim);
  if (fused_post && !(tensor_cores && pp.chunked))
    fail("attention_paged: a fused qkv post needs the chunked tensor-core kernel (p.chunked)");
  if (tensor_cores && pp.chunked)
    attention_decode_chunked(q, n, at, pp, out, stream, fused_post);
  else if (tensor_cores)
    attention_decode_mma(q, n, at, pp, out, stream);
  else
    attention_cuda_cores(q, n, at, pp, out, stream);
  if (p.splits == 1 || (tensor_cores && attention_decode_chunked_merges(pp))) return;
  // A thread per dimension (128 to 512 threads), so each sums its splits once.
  const unsigned threads = unsigned(std::clamp<int64_t>((p.head_dim + 31) / 32 * 32, 128, 512));
  launch(attention_combine_kernel, unsigned(n * p.heads), threads, 0, stream, p, out);
  CUDA_CHECK(cudaGetLastError());
}

bool attention_quantizes_out(const PagedAttention& p) {
  return attention_decode_mma_supported(p) && p.head_dim % 32 == 0;
}

void qkv_post(const float* qkv, int64_t n, const StepLayout& at, const QkvPost& p,
              cudaStream_t stream) {
  if (n <= 0) return;
  if (p.head_dim > 32 * kMaxDimsPerLane)
    fail("qkv_post: head_dim %lld (at most %d)", (long long)p.head_dim, 32 * kMaxDimsPerLane);
  const int64_t per_token = p.heads + (p.own_kv ? 2 * p.kv_heads : 0);
  // A warp per head (head dim 64, 128 or 256, RoPE over the whole head or
  // none) for steps of kWarpPostMinTokens tokens or more; decode steps keep
  // the block kernel they were tuned with.
  const int dpl = int(p.head_dim / 32);
  const bool warps = qkv_post_warps_enabled() && n >= kWarpPostMinTokens && p.head_dim % 32 == 0 &&
                     (dpl == 2 || dpl == 4 || dpl == 8) &&
                     (p.rotary_dim == 0 || p.rotary_dim == p.head_dim);
  if (warps) {
    constexpr int kWarpsPerBlock = 8;
    const int64_t units = n * per_token;
    const unsigned blocks = unsigned((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
    void (*kernel)(const float*, StepLayout, QkvPost, int64_t) = qkv_post_warps_kernel<8>;
    if (dpl == 2) kernel = qkv_post_warps_kernel<2>;
    if (dpl == 4) kernel = qkv_post_warps_kernel<4>;
    launch(kernel, blocks, 32 * kWarpsPerBlock, 0, stream, qkv, at, p, units);
  } else {
    const dim3 grid{unsigned(n), unsigned(per_token)};
    launch(qkv_post_kernel, grid, 128, 0, stream, qkv, at, p);
  }
  CUDA_CHECK(cudaGetLastError());
}

void rope_rotate_half(float* x, int64_t n, int64_t heads, int64_t head_dim,
                      const int64_t* positions, const float* inv_freq, int64_t rotary_dim,
                      float scaling, cudaStream_t stream) {
  if (n <= 0 || rotary_dim <= 0) return;
  launch(rope_kernel, unsigned(n), 128, 0, stream, x, heads, head_dim, positions, inv_freq,
         rotary_dim / 2, scaling);
  CUDA_CHECK(cudaGetLastError());
}

void kv_write(const float* rows, int64_t n, int64_t kv_dim, void* base, bool bf16,
              int64_t block_size, const StepLayout& at, cudaStream_t stream) {
  if (n <= 0) return;
  launch(kv_write_kernel, unsigned(n), 128, 0, stream, rows, kv_dim, base, bf16, block_size, at);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
