// Prefill attention on tensor cores (flash attention): the paged-attention
// contract of attention_paged (backend/cuda/kernels.h) for steps that carry
// runs of consecutive tokens of a sequence, where one block per token (the
// decode kernel) recomputes every key tile once per query token on CUDA
// cores.
//
// One block of 4 warps per (query tile of up to 64 tokens of one sequence,
// query head, chunk of DV output dims); each warp owns 16 query rows. Key
// tiles of 32 rows go to shared memory as rows of keys: over bf16 rows (the
// default on CUDA) as stored, copied with cp.async one tile ahead of the
// one being computed; over f32 rows as bf16 hi + lo parts (x = hi + lo to
// 16 significant bits, as the GEMMs' activations), one tile at a time.
// Scores and outputs are mma.sync m16n8k16 bf16 products with f32
// accumulation, the B fragments read with ldmatrix (V's transposed), three
// products per product (hi·hi + hi·lo + lo·hi; two over bf16 rows, whose lo
// part is zero), so the result keeps close to f32 accuracy over the stored
// rows: the CPU backend and the decode kernel are the reference. With
// PagedAttention::bf16_inputs, q·scale and the softmax weights are rounded
// to bf16 instead (one product over bf16 rows, as other engines' flash
// attention over bf16 tensors). The
// softmax is online, in registers (the score accumulators become the P·V A
// operand without a trip through shared memory).
#include <cfloat>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 32;           // keys per tile
constexpr int kPad = 8;             // bf16 row padding: fragment loads hit distinct banks

// Shared memory: q·scale as hi/lo parts, and two K and two V tile buffers,
// rows of keys (K: [kKeys][Dh + kPad], V: [kKeys][DV + kPad]). Over f32
// rows they are one tile's hi and lo parts, filled synchronously; over bf16
// rows two stages of the stored values (no lo part), the next tile copied
// in (cp.async) while the current one is computed.
struct Smem {
  uint16_t *q_hi, *q_lo;  // [kRows][Dh + kPad]
  uint16_t* k[2];         // k[1] = k[0] + kKeys · (Dh + kPad)
  uint16_t* v[2];         // v[1] = v[0] + kKeys · (DV + kPad)
  int *row_lo, *row_hi;   // [kRows]: each query row's key range
  int* range;             // [2]: the block's key range
};

__host__ __device__ inline size_t smem_bytes(int head_dim, int dv) {
  const size_t kp = size_t(head_dim + kPad), vp = size_t(dv + kPad);
  return 2 * (2 * kRows * kp + 2 * kKeys * kp + 2 * kKeys * vp) + (2 * kRows + 2) * sizeof(int);
}

__device__ inline Smem carve(void* base, int head_dim, int dv) {
  Smem s;
  const int kp = head_dim + kPad, vp = dv + kPad;
  uint16_t* p = static_cast<uint16_t*>(base);
  s.q_hi = p;
  s.q_lo = s.q_hi + kRows * kp;
  s.k[0] = s.q_lo + kRows * kp;
  s.k[1] = s.k[0] + kKeys * kp;
  s.v[0] = s.k[1] + kKeys * kp;
  s.v[1] = s.v[0] + kKeys * vp;
  s.row_lo = reinterpret_cast<int*>(s.v[1] + kKeys * vp);
  s.row_hi = s.row_lo + kRows;
  s.range = s.row_hi + kRows;
  return s;
}

// Where a key tile's rows are (the sequence's paged rows of the kv head) and
// the block's key range (keys outside it are never read).
struct TileRows {
  PagedRows rows;
  int range_lo, key_hi;
  __device__ __forceinline__ bool has(int key) const { return key >= range_lo && key < key_hi; }
  __device__ __forceinline__ size_t row(int j) const { return rows.row(j); }
};

// bf16 rows: keys [kb, kb + 32) into stage `st` as they are stored, 16 bytes
// per copy (zeros outside the range and past the head dim), as one cp.async
// group.
template <int DV>
__device__ __forceinline__ void fill_async(const TileRows& r, const PagedAttention& p,
                                           const Smem& sm, int Dh, int d0, int kb, int st) {
  const int kp = Dh + kPad, vp = DV + kPad;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v_base);
  for (int i = threadIdx.x; i < kKeys * (Dh / 8); i += kWarps * 32) {
    const int key = i / (Dh / 8), c = 8 * (i % (Dh / 8));
    const bool ok = r.has(kb + key);
    cp_async16(sm.k[0] + (st * kKeys + key) * kp + c, ok ? kbase + r.row(kb + key) + c : kbase, ok);
  }
  for (int i = threadIdx.x; i < kKeys * (DV / 8); i += kWarps * 32) {
    const int key = i / (DV / 8), c = 8 * (i % (DV / 8));
    const bool ok = r.has(kb + key) && d0 + c < Dh;
    cp_async16(sm.v[0] + (st * kKeys + key) * vp + c, ok ? vbase + r.row(kb + key) + d0 + c : vbase,
               ok);
  }
  cp_async_commit();
}

// f32 rows: keys [kb, kb + 32) as hi (buffer 0) and lo (buffer 1) parts.
template <int DV>
__device__ __forceinline__ void fill_split(const TileRows& r, const PagedAttention& p,
                                           const Smem& sm, int Dh, int d0, int kb) {
  const int kp = Dh + kPad, vp = DV + kPad;
  const float* kbase = static_cast<const float*>(p.k_base);
  const float* vbase = static_cast<const float*>(p.v_base);
  auto put = [](uint16_t* hi, uint16_t* lo, float4 v) {
    uint32_t h01, l01, h23, l23;
    split2(v.x, v.y, h01, l01);
    split2(v.z, v.w, h23, l23);
    *reinterpret_cast<uint2*>(hi) = make_uint2(h01, h23);
    *reinterpret_cast<uint2*>(lo) = make_uint2(l01, l23);
  };
  for (int i = threadIdx.x; i < kKeys * (Dh / 4); i += kWarps * 32) {
    const int key = i / (Dh / 4), c = 4 * (i % (Dh / 4));
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r.has(kb + key)) v = *reinterpret_cast<const float4*>(kbase + r.row(kb + key) + c);
    put(sm.k[0] + key * kp + c, sm.k[1] + key * kp + c, v);
  }
  for (int i = threadIdx.x; i < kKeys * (DV / 4); i += kWarps * 32) {
    const int key = i / (DV / 4), c = 4 * (i % (DV / 4));
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r.has(kb + key) && d0 + c < Dh)
      v = *reinterpret_cast<const float4*>(vbase + r.row(kb + key) + d0 + c);
    put(sm.v[0] + key * vp + c, sm.v[1] + key * vp + c, v);
  }
}

// grid: (tiles, heads, head_dim / DV rounded up). tiles[2i], tiles[2i + 1]:
// the first and one-past-last step token of tile i. BF16: the rows are bf16
// (p.kv_bf16). A_EXACT: q·scale and the weights as bf16 alone
// (p.bf16_inputs).
template <int DV, bool BF16, bool A_EXACT>
__global__ void __launch_bounds__(kWarps * 32)
    prefill_attention_kernel(const float* q, StepLayout at, PagedAttention p,
                             const int32_t* __restrict__ tiles, float* __restrict__ out) {
  extern __shared__ __align__(16) uint8_t shared_raw[];
  pdl_launch_dependents();
  pdl_wait();
  const int Dh = int(p.head_dim), kp = Dh + kPad, vp = DV + kPad;
  const Smem sm = carve(shared_raw, Dh, DV);
  const int t0 = tiles[2 * blockIdx.x], rows = tiles[2 * blockIdx.x + 1] - t0;
  const int h = int(blockIdx.y), kvh = h / int(p.heads / p.kv_heads);
  const int d0 = int(blockIdx.z) * DV;  // this block's output dims [d0, d0 + DV)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tq = lane % 4;  // mma fragment coordinates
  const int q_dim = int(p.heads) * Dh;

  // Query rows: key ranges, and the block's union of them.
  if (threadIdx.x == 0) {
    sm.range[0] = INT32_MAX;
    sm.range[1] = 0;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    int lo = 0, hi = 0;  // rows past the tile see no key
    if (int(threadIdx.x) < rows) {
      const int t = t0 + int(threadIdx.x);
      lo = int(first_key(at, p, t));
      hi = int(at.key_end[t]);
      atomicMin(&sm.range[0], lo);
      atomicMax(&sm.range[1], hi);
    }
    sm.row_lo[threadIdx.x] = lo;
    sm.row_hi[threadIdx.x] = hi;
  }
  // q · scale as hi/lo parts (zeros past the tile).
  for (int i = threadIdx.x; i < kRows * (Dh / 2); i += kWarps * 32) {
    const int r = i / (Dh / 2), c = 2 * (i % (Dh / 2));
    float2 v = make_float2(0.f, 0.f);
    if (r < rows) v = *reinterpret_cast<const float2*>(q + size_t(t0 + r) * q_dim + h * Dh + c);
    uint32_t hi, lo;
    split2(v.x * p.scale, v.y * p.scale, hi, lo);
    *reinterpret_cast<uint32_t*>(sm.q_hi + r * kp + c) = hi;
    if constexpr (!A_EXACT) *reinterpret_cast<uint32_t*>(sm.q_lo + r * kp + c) = lo;
  }
  __syncthreads();
  // Tiles start at multiples of 32; keys below range_lo are never read (a
  // sliding layer's table may no longer hold their blocks).
  const int range_lo = sm.range[0], key_lo = range_lo / kKeys * kKeys, key_hi = sm.range[1];
  // This warp's rows: g and g + 8 of its 16.
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const int lo0 = sm.row_lo[r0], hi0 = sm.row_hi[r0], lo1 = sm.row_lo[r1], hi1 = sm.row_hi[r1];
  int warp_lo = INT32_MAX, warp_hi = 0;
  for (int r = warp * 16; r < warp * 16 + 16; ++r)
    if (sm.row_hi[r] > sm.row_lo[r]) {
      warp_lo = min(warp_lo, sm.row_lo[r]);
      warp_hi = max(warp_hi, sm.row_hi[r]);
    }

  const TileRows src{paged_rows(at, p, t0, kvh), range_lo, key_hi};

  float o[DV / 8][4];
#pragma unroll
  for (int n = 0; n < DV / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;  // rows r0, r1 (this lane's part of l)

  int st = 0;  // bf16 rows: the stage holding the current tile
  if constexpr (BF16)
    if (key_lo < key_hi) fill_async<DV>(src, p, sm, Dh, d0, key_lo, 0);
  for (int kb = key_lo; kb < key_hi; kb += kKeys) {
    if constexpr (BF16) {
      if (kb + kKeys < key_hi) {
        fill_async<DV>(src, p, sm, Dh, d0, kb + kKeys, st ^ 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      __syncthreads();  // the previous tile is consumed
      fill_split<DV>(src, p, sm, Dh, d0, kb);
      __syncthreads();
    }
    // The tile's buffers: stored values (hi) and, over f32 rows, lo parts.
    // (Stage st's buffers are found by offset: indexing sm.k[st] would put
    // the struct in local memory.)
    const uint16_t* kh = BF16 ? sm.k[0] + st * kKeys * kp : sm.k[0];
    const uint16_t* kl = sm.k[1];
    const uint16_t* vh = BF16 ? sm.v[0] + st * kKeys * vp : sm.v[0];
    const uint16_t* vl = sm.v[1];
    if (kb < warp_hi && kb + kKeys > warp_lo) {  // some key of this tile for these rows
      // S = q · kᵀ for the warp's 16 rows and the tile's 32 keys.
      float s[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      warp_scores<BF16, 4, true, A_EXACT>(s, sm.q_hi + warp * 16 * kp, sm.q_lo + warp * 16 * kp, kp,
                                          kh, kl, kp, Dh);
      // Soft-cap and mask rows r0 (s[n][0..1]) and r1 (s[n][2..3]), then the
      // online softmax and O += P · V.
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = kb + n * 8 + 2 * tq + (e & 1);
          float v = s[n][e];
          if (p.softcap > 0.f) v = p.softcap * tanhf(v / p.softcap);
          const bool ok = e < 2 ? key >= lo0 && key < hi0 : key >= lo1 && key < hi1;
          s[n][e] = ok ? v : -INFINITY;
        }
      online_softmax(s, o, m0, m1, l0, l1);
      warp_weighted_values<BF16, 4, DV / 8, A_EXACT>(o, s, vh, vl, vp);
    }
    if constexpr (BF16) {
      __syncthreads();  // every warp is done with stage st before it is refilled
      st ^= 1;
    }
  }
  store_warp_rows(p, out, o, l0, l1, r0, rows, int64_t(t0) * q_dim + h * Dh + d0, q_dim, Dh - d0,
                  tq);
}

// Output dims per block: each chunk recomputes the scores, so a head dim of
// 256 takes one chunk of 256 (128 accumulator registers per thread; 136 KB
// of shared memory). 512 takes two of 128 (218 KB): one of 256 would need
// 234 KB.
int dv_for(int64_t head_dim) {
  return head_dim == 256 ? 256 : head_dim % 128 == 0 ? 128 : 64;
}

template <int DV, bool BF16, bool A_EXACT>
void launch_prefill_kernel(dim3 grid, size_t smem, const float* q, const StepLayout& at,
                           const PagedAttention& p, const int32_t* tiles, float* out,
                           cudaStream_t stream) {
  const auto kernel = prefill_attention_kernel<DV, BF16, A_EXACT>;
  allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
  launch(kernel, grid, kWarps * 32, smem, stream, q, at, p, tiles, out);
}

template <int DV, bool BF16>
void launch_prefill_typed(dim3 grid, size_t smem, const float* q, const StepLayout& at,
                          const PagedAttention& p, const int32_t* tiles, float* out,
                          cudaStream_t stream) {
  if (p.bf16_inputs)
    launch_prefill_kernel<DV, BF16, true>(grid, smem, q, at, p, tiles, out, stream);
  else
    launch_prefill_kernel<DV, BF16, false>(grid, smem, q, at, p, tiles, out, stream);
}

template <int DV>
void launch_prefill(dim3 grid, size_t smem, const float* q, const StepLayout& at,
                    const PagedAttention& p, const int32_t* tiles, float* out,
                    cudaStream_t stream) {
  if (p.kv_bf16)
    launch_prefill_typed<DV, true>(grid, smem, q, at, p, tiles, out, stream);
  else
    launch_prefill_typed<DV, false>(grid, smem, q, at, p, tiles, out, stream);
}

// attention_prefill_bf16 takes the shapes it can, unless
// TANDEM_CUDA_PREFILL_BF16=0 (read at each launch, so a test or benchmark
// can set the general kernel against it).
bool prefill_bf16_enabled() {
  return !env_is("TANDEM_CUDA_PREFILL_BF16", "0");
}

}  // namespace

bool attention_prefill_supported(int64_t head_dim, int device) {
  if (head_dim <= 0 || head_dim % 16 != 0 || head_dim > 512) return false;
  const LaunchLimits limits = launch_limits(device);
  return limits.cc_major >= 8 && smem_bytes(int(head_dim), dv_for(head_dim)) <= limits.smem_optin;
}

std::vector<int32_t> attention_prefill_tiles(const int32_t* seq, int64_t n) {
  std::vector<int32_t> tiles;
  for (int64_t t = 0; t < n;) {
    int64_t end = t + 1;
    while (end < n && end - t < kRows && seq[end] == seq[t]) ++end;
    tiles.push_back(int32_t(t));
    tiles.push_back(int32_t(end));
    t = end;
  }
  return tiles;
}

PrefillAttentionPlan plan_prefill_attention(const int32_t* seq, int64_t n) {
  PrefillAttentionPlan plan;
  int64_t& p = plan.decode_tokens;
  while (p < n && (p == 0 || seq[p - 1] != seq[p]) && (p + 1 == n || seq[p + 1] != seq[p])) ++p;
  plan.tiles = attention_prefill_tiles(seq + p, n - p);
  for (int32_t& t : plan.tiles) t += int32_t(p);
  return plan;
}

void attention_prefill(const float* q, const StepLayout& at, const int32_t* tiles, int64_t n_tiles,
                       const PagedAttention& p, float* out, cudaStream_t stream) {
  if (n_tiles <= 0) return;
  if (p.out_quantized)
    fail("attention_prefill: quantized output rows (out_quantized) are the decode kernels' only");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (!attention_prefill_supported(p.head_dim, device) || p.kv_heads <= 0 ||
      p.heads % p.kv_heads != 0)
    fail("attention_prefill: head_dim %lld, heads %lld / kv_heads %lld unsupported on this device",
         (long long)p.head_dim, (long long)p.heads, (long long)p.kv_heads);
  if (p.block_size <= 0 || (p.block_size & (p.block_size - 1)) != 0)
    fail("attention_prefill: block_size %lld is not a power of two", (long long)p.block_size);
  if (prefill_bf16_enabled() && attention_prefill_bf16_takes(p, device)) {
    attention_prefill_bf16(q, at, tiles, n_tiles, p, out, stream);
    return;
  }
  PagedAttention pp = p;
  pp.block_shift = 0;
  while ((int64_t(1) << pp.block_shift) < p.block_size) ++pp.block_shift;
  const int dv = dv_for(p.head_dim);
  const size_t smem = smem_bytes(int(p.head_dim), dv);
  const dim3 grid(unsigned(n_tiles), unsigned(p.heads), unsigned((p.head_dim + dv - 1) / dv));
  if (dv == 256)
    launch_prefill<256>(grid, smem, q, at, pp, tiles, out, stream);
  else if (dv == 128)
    launch_prefill<128>(grid, smem, q, at, pp, tiles, out, stream);
  else
    launch_prefill<64>(grid, smem, q, at, pp, tiles, out, stream);
}

}  // namespace tandem::cuda
