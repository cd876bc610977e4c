// Decode attention on tensor cores over bf16 KV rows: attention_paged's
// contract (backend/cuda/kernels.h) for a kv head's query heads of one
// token, where the CUDA-core kernel (attention.cu) spends its time in
// shared-memory passes and block barriers rather than in reading the rows.
//
// A warp per (token, kv head, key range). Its G query heads (G ≤ 16) are
// the rows of an m16n8k16 mma (rows past G are zeros); q·scale is split
// into bf16 hi/lo parts, the rows are bf16 as stored, so each product is
// two mma (hi·k + lo·k) and keeps close to f32 accuracy over the stored
// rows — or, with PagedAttention::bf16_inputs (--gemm-precision bf16, the
// default), q·scale and the softmax weights are rounded to bf16: one mma
// per product (H200, 32 sequences at context 1024: llama-3.2-1b +2%,
// qwen3-1.7b +5%, gemma-4-e2b +3%; batch 1 +1-3%). Key tiles (32 keys; 16 for head dim 256) are
// copied with cp.async into the warp's own shared memory (one tile ahead of the one being computed,
// or after it with a single buffer) and read with ldmatrix (V transposed by ldmatrix.trans). The
// softmax is online, in registers. A block is one such warp (no block barrier), or key warps
// sharing its q that merge in shared memory at the end. The output is final (splits == 1) or a
// partial (m, l, unnormalized o) for the split combine of attention.cu.
#include <cfloat>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/attention_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

constexpr int kRowsPerWarp = 16;  // query heads of a kv head, at most
constexpr int kPad = 8;           // bf16 row padding: ldmatrix rows hit distinct banks

__host__ __device__ constexpr int tile_keys(int head_dim) {
  return head_dim <= 128 ? 32 : 16;
}

// The kernel's shape for head dim DH. Up to 256, one warp: 16 query rows and
// every output dim in its registers. At 512 (Gemma 4's global layers) the
// output (256 registers a lane) does not fit one warp, so two warps share
// the q and K tiles, each computes the scores and takes half the output
// dims (and its half of each V tile); the query heads are at most 8 (the
// mma's rows 8-15 are not stored), which keeps the block at two per SM.
template <int DH>
struct DecodeShape {
  static constexpr int kWarps = DH > 256 ? 2 : 1;
  static constexpr int kQRows = DH > 256 ? 8 : kRowsPerWarp;
  static constexpr int kOutDims = DH / kWarps;  // output dims of one warp
  static constexpr int kKeys = tile_keys(DH);
  static constexpr int kPitch = DH + kPad, kOutPitch = kOutDims + kPad;
  // Key warps (PagedAttention::key_warps): up to this many copies of the
  // one-warp shape in a block, each over its share of the block's keys.
  // Measured on the H200 at batch 1 (tok/s, one-warp blocks and a combine
  // kernel → key warps): llama-3.2-1b (dim 64, 8 warps) 903 → 1,002 at
  // context 128, 818 → 924 at 4,096; qwen3-1.7b (dim 128, 4) 607 → 634;
  // ministral-3-3b (128) 362 → 362. At dim 256 four double-buffered warps,
  // each with its own copy of q, lost (gemma-3-1b 740 → 720); eight
  // single-buffered warps sharing q fit the same shared memory and win:
  // gemma-3-1b 773 → 789 at context 128, 748 → 772 at 4,096, 13,610 →
  // 13,701 at 32 sequences; gemma-4-e2b (sliding layers) 379 → 375, 364 →
  // 367, 6,631 → 6,588.
  static constexpr int kMaxKeyWarps = DH <= 64 ? 8 : DH <= 128 ? 4 : DH <= 256 ? 8 : 1;
  // Key-tile stages of a key warp: two (the next tile is copied while this
  // one is computed), or one for dim-256 key warps, whose 8 warps overlap
  // each other's copies instead (launch_decode also takes one stage at dims
  // 64 and 128 when the grid has more blocks than SMs).
  __host__ __device__ static constexpr int stages(int key_warps) {
    return key_warps > 1 && DH >= 256 ? 1 : 2;
  }
  // Shared bf16 values: the block's q hi/lo [kQRows][kPitch], then per key
  // warp its stages of K tiles [kKeys][kPitch] and each warp's stages of V
  // tiles [kKeys][kOutPitch]; then an mbarrier per key warp and stage (the
  // bulk copies of sm_90, kBulkRows).
  static constexpr size_t kQBytes = size_t(2) * 2 * kQRows * kPitch;
  __host__ __device__ static constexpr size_t warp_bytes(int stages) {
    return size_t(2) * stages * (kKeys * kPitch + kWarps * kKeys * kOutPitch);
  }
  __host__ __device__ static constexpr size_t barriers_at(int key_warps, int stages) {
    return kQBytes + size_t(key_warps) * warp_bytes(stages);
  }
  __host__ __device__ static constexpr size_t smem_bytes(int key_warps, int stages) {
    return barriers_at(key_warps, stages) + size_t(8) * key_warps * stages;
  }
  // Head dim 256 on sm_90 copies each key's K and V rows with one bulk
  // copy (mma.h) instead of a cp.async per 16 bytes. Measured on the H200
  // with every one-warp shape on bulk copies: gemma-3-1b +2.8% at batch 1
  // (context 128; +3.5% at 4,096), +2.6% at 32 sequences; at dim 128
  // (qwen3, ministral) within ±1%; at dim 64 (llama-3.2-1b: 128-byte rows)
  // −5% at batch 1, context 4,096, and −6% at 32 sequences.
  static constexpr bool kBulkRows = DH == 256;
  // A key warp's merge inputs (o of its rows, then m and l) fit its
  // share of shared memory, free once its loop is done.
  static_assert(kMaxKeyWarps == 1 || (kQRows * DH + 2 * kQRows) * 4 <= warp_bytes(1), "merge fits");
};

// Block-wide barrier over the kernel's warps (one warp: __syncwarp).
template <int WARPS>
__device__ __forceinline__ void sync_warps() {
  if constexpr (WARPS == 1)
    __syncwarp();
  else
    __syncthreads();
}

// The end of a block of KW key warps (one-warp shape: DO = DH, 16 rows):
// each warp leaves its rows' unnormalized o, m and l in its own shared
// memory (`own`, one of the KW `regions` of DecodeShape::warp_bytes; its
// tiles are dead), then the block merges them as the split combine does — into out (splits == 1) or
// the block's partial.
template <int DH, int KW, int ST>
__device__ __forceinline__ void merge_key_warps(const float (&o)[DH / 8][4], float m0, float m1,
                                                float l0, float l1, uint8_t* own,
                                                const uint8_t* regions, int G, int kvh, int64_t t,
                                                int split, const PagedAttention& p, float* out) {
  using S = DecodeShape<DH>;
  constexpr int QR = S::kQRows;
  const int lane = int(threadIdx.x) % 32, g = lane / 4, tq = lane % 4;
  float* mine = reinterpret_cast<float*>(own);  // [QR][DH] o, then [QR] m, [QR] l
#pragma unroll
  for (int half = 0; half < QR / 8; ++half) {
    const int r = g + 8 * half;
    if (r >= G) continue;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n)
      *reinterpret_cast<float2*>(mine + r * DH + n * 8 + 2 * tq) =
          make_float2(o[n][2 * half], o[n][2 * half + 1]);
    if (tq == 0) {
      mine[QR * DH + r] = half ? m1 : m0;
      mine[QR * DH + QR + r] = half ? l1 : l0;
    }
  }
  __syncthreads();
  auto warp_sums = [&](int w) {
    return reinterpret_cast<const float*>(regions + w * S::warp_bytes(ST));
  };
  for (int i = int(threadIdx.x); i < G * DH; i += 32 * KW) {
    const int r = i / DH, d = i % DH;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      const float* f = warp_sums(w);
      if (f[QR * DH + QR + r] > 0.f) mx = fmaxf(mx, f[QR * DH + r]);
    }
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < KW; ++w) {
      const float* f = warp_sums(w);
      const float lw = f[QR * DH + QR + r];
      if (lw > 0.f) {
        const float c = expf(f[QR * DH + r] - mx);
        l += lw * c;
        acc += f[r * DH + d] * c;
      }
    }
    const int64_t h = int64_t(kvh) * G + r;
    if (p.splits == 1) {
      const float v = l > 0.f ? acc / l : 0.f;
      store_out(p, out, t * p.heads * DH + h * DH + d, v);
      // A warp's 32 values are 32 consecutive dims of one head (DH and the
      // loop's step are multiples of 32).
      if (p.out_quantized)
        store_quantized32(quantized_row(p, t), int(p.heads * DH), int((h * DH + d) / 32), v);
    } else {
      float* part = split_partial(p, t, h, split, DH);
      if (d == 0) {
        part[0] = mx;
        part[1] = l;
      }
      part[2 + d] = acc;
    }
  }
}

// grid: (tokens · kv heads, splits); 32 threads per warp of DecodeShape,
// times KW key warps (1 or kMaxKeyWarps), which share q and each have their
// own tiles in ST stages (DecodeShape::smem_bytes(KW, ST) of shared memory).
// BQ: q·scale and the softmax weights rounded to bf16 (one product each
// instead of hi/lo two; PagedAttention::bf16_inputs).
template <int DH, int KW, int ST, bool BQ>
__global__ void __launch_bounds__(32 * DecodeShape<DH>::kWarps * KW)
    decode_attention_kernel(const float* q, StepLayout at, PagedAttention p,
                            float* __restrict__ out) {
  using S = DecodeShape<DH>;
  constexpr int KT = S::kKeys, P = S::kPitch, PO = S::kOutPitch, DO = S::kOutDims;
  constexpr int W = S::kWarps, QR = S::kQRows, NT = 32 * W;
  static_assert(KW == 1 || W == 1, "only one-warp shapes split keys over warps");
  extern __shared__ __align__(16) uint8_t shared_raw[];
  const int kw = int(threadIdx.x) / NT;  // this key warp
  uint16_t* q_hi = reinterpret_cast<uint16_t*>(shared_raw);
  uint16_t* q_lo = q_hi + QR * P;
  uint8_t* regions = shared_raw + S::kQBytes;
  uint8_t* own_raw = regions + kw * S::warp_bytes(ST);
  uint16_t* k_tiles = reinterpret_cast<uint16_t*>(own_raw);  // [ST][KT][P]
  const int tid = int(threadIdx.x) % NT, warp = tid / 32, lane = tid % 32, g = lane / 4,
            tq = lane % 4;
  uint16_t* v_tiles = k_tiles + ST * KT * P + warp * ST * KT * PO;  // this warp's [ST][KT][PO]
  pdl_launch_dependents();
  const int G = int(p.heads / p.kv_heads);
  const int64_t t = blockIdx.x / p.kv_heads;
  const int kvh = int(blockIdx.x % p.kv_heads), split = int(blockIdx.y);
  const int q_dim = int(p.heads) * DH;

  // The split's keys and their rows depend only on the step's inputs, so
  // the first tile's block-table lookups go out before the PDL wait.
  KeyRange keys = split_keys(at, p, t, split);
  if constexpr (KW > 1) {  // this warp's share of the block's keys
    const int64_t share = (keys.end - keys.first + KW - 1) / KW;
    keys.first = keys.first + kw * share < keys.end ? keys.first + kw * share : keys.end;
    keys.end = keys.first + share < keys.end ? keys.first + share : keys.end;
  }
  const int first = int(keys.first), end = int(keys.end);
  const PagedRows rows = paged_rows(at, p, t, kvh);
  // Lane k's part of a tile at kb: key kb + k's row (KT ≤ 32).
  auto tile_row = [&](int kb) {
    return lane < KT && kb + lane < end ? (unsigned long long)rows.row(kb + lane) : 0ull;
  };
  const unsigned long long first_rows = tile_row(first);
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v_base);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool BULK = S::kBulkRows;
#else
  constexpr bool BULK = false;
#endif
  // This key warp's stage barriers (BULK), and the phase each waits for
  // next (bit st).
  uint64_t* bars = reinterpret_cast<uint64_t*>(shared_raw + S::barriers_at(KW, ST)) + kw * ST;
  uint32_t parity = 0;
  if constexpr (BULK) {
    if (lane == 0)
      for (int s = 0; s < ST; ++s) mbarrier_init(bars + s);
    __syncwarp();
  }
  // BULK copies cannot zero-fill: keys past the split's end copy the split's
  // first key's row instead (finite values: their weights are 0, and 0 · NaN
  // from stale shared memory would not be).
  const unsigned long long fallback_row = __shfl_sync(0xffffffffu, first_rows, 0);
  // Keys [kb, kb + KT) ∩ [from, to) into stage st (every key of a stage is
  // copied once, by one call or two).
  //  - cp.async: zeros past the split's end; the K tile by the whole block,
  //    each warp's V dims by the warp; `parts` 1 copies the K tile, 2 the V
  //    tile, 3 both, as one commit group. The copies take each key's row by
  //    shuffle from the lane that looked it up (tile_row): a block-table
  //    load per copy was a dependent global load each (the cp.async asm
  //    clobbers memory, so none was reused).
  //  - BULK: lane k copies key kb + k's K and V rows whole, on stage st's
  //    barrier; `arm` (once per stage fill, by the call that starts it) sets
  //    the bytes the phase waits for: every key of the tile.
  auto fill = [&](int kb, int st, unsigned long long my_row, int from, int to, bool arm,
                  int parts = 3) {
    if constexpr (BULK) {
      fence_async_shared();  // this stage's earlier reads before the copies overwrite it
      if (arm && lane == 0) mbarrier_expect_tx(bars + st, uint32_t(KT * 2 * DH * 2));
      const int key = kb + lane;
      if (lane < KT && key >= from && key < to) {
        const size_t r = size_t(key < end ? my_row : fallback_row);
        bulk_copy(k_tiles + (st * KT + lane) * P, kbase + r, DH * 2, bars + st);
        bulk_copy(v_tiles + (st * KT + lane) * PO, vbase + r, DH * 2, bars + st);
      }
    } else {
      for (int i = tid; (parts & 1) && i < KT * (DH / 8); i += NT) {
        const int key = i / (DH / 8), c = 8 * (i % (DH / 8));
        const bool ok = kb + key < end;
        const size_t r = size_t(__shfl_sync(0xffffffffu, my_row, key)) + size_t(c);
        if (kb + key >= from && kb + key < to)
          cp_async16(k_tiles + (st * KT + key) * P + c, kbase + (ok ? r : 0), ok);
      }
      for (int i = lane; (parts & 2) && i < KT * (DO / 8); i += 32) {
        const int key = i / (DO / 8), c = 8 * (i % (DO / 8));
        const bool ok = kb + key < end;
        const size_t r = size_t(__shfl_sync(0xffffffffu, my_row, key)) + size_t(warp * DO + c);
        if (kb + key >= from && kb + key < to)
          cp_async16(v_tiles + (st * KT + key) * PO + c, vbase + (ok ? r : 0), ok);
      }
      cp_async_commit();
    }
  };

  // The first tile's keys that no earlier kernel of the step writes are
  // copied before the PDL wait: with p.one_new_key, all but the token's own
  // position (which qkv_post writes); the rest after it, before q is staged,
  // so the two latencies overlap.
  const int stable_end = p.one_new_key ? min(end, int(at.key_end[t]) - 1) : first;
  if (first < stable_end) fill(first, 0, first_rows, first, stable_end, true);
  pdl_wait();
  if (first < end)
    fill(first, 0, first_rows, max(first, stable_end), first + KT, !(first < stable_end));

  // q · scale of the G heads as hi/lo parts, staged by the whole block
  // (rows past G: zeros).
  stage_q_parts<QR, DH, NT * KW, BQ>(q + t * q_dim + size_t(kvh) * G * DH, G, p.scale, q_hi, q_lo,
                                     P, int(threadIdx.x));

  float o[DO / 8][4];
#pragma unroll
  for (int n = 0; n < DO / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;  // rows g and g + 8 (this lane's part)

  // Key warps read the q their block staged (one warp: the loop's first
  // barrier makes it visible).
  if constexpr (KW > 1) __syncthreads();

  // One cp.async stage: the next K tile is copied while this tile's values
  // are weighted, the next V tile while its scores are computed (a group
  // each), so a warp never waits on a whole tile with nothing in flight.
  constexpr bool SPLIT_KV = ST == 1 && !BULK;
  int st = 0;
  for (int kb = first; kb < end; kb += KT) {
    // Two stages: the next tile's copies go out before this one is waited
    // for. One stage: its row lookups do, the copies after the compute.
    unsigned long long next_rows = 0;
    const bool more = kb + KT < end;
    if (ST == 2 && more) {
      fill(kb + KT, st ^ 1, tile_row(kb + KT), kb + KT, kb + 2 * KT, true);
      if constexpr (!BULK) cp_async_wait<1>();
    } else {
      if (ST == 1 && more) next_rows = tile_row(kb + KT);
      if constexpr (SPLIT_KV) {
        if (kb == first)
          cp_async_wait<0>();  // the first tile, copied whole before the loop
        else
          cp_async_wait<1>();  // this K tile; its V tile may still be in flight
      } else if constexpr (!BULK) {
        cp_async_wait<0>();
      }
    }
    if constexpr (BULK) {
      mbarrier_wait(bars + st, (parity >> st) & 1u);
      parity ^= 1u << st;
    }
    sync_warps<W>();  // every thread's copies of this tile (and, the first time, q) are visible
    const uint16_t* kt = k_tiles + st * KT * P;
    const uint16_t* vt = v_tiles + st * KT * PO;
    // S = q · kᵀ: 16 rows × KT keys; soft-cap, mask the keys past the split
    // (rows past G are zeros: finite), online softmax, O += P · V.
    float s[KT / 8][4];
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    warp_scores<true, KT / 8, (QR > 8), BQ>(s, q_hi, q_lo, P, kt, nullptr, P, DH);
#pragma unroll
    for (int n = 0; n < KT / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e];
        if (p.softcap > 0.f) v = p.softcap * tanhf(v / p.softcap);
        s[n][e] = kb + n * 8 + 2 * tq + (e & 1) < end ? v : -INFINITY;
      }
    online_softmax(s, o, m0, m1, l0, l1);
    if constexpr (SPLIT_KV) {
      sync_warps<W>();  // the K tile is read: copy the next one in
      if (more) {
        fill(kb + KT, 0, next_rows, kb + KT, kb + 2 * KT, true, 1);
        cp_async_wait<1>();  // this V tile
      } else {
        cp_async_wait<0>();
      }
      sync_warps<W>();
    }
    warp_weighted_values<true, KT / 8, DO / 8, BQ>(o, s, vt, nullptr, PO);
    sync_warps<W>();  // this stage is read before the next iteration refills it
    if constexpr (SPLIT_KV) {
      if (more) fill(kb + KT, 0, next_rows, kb + KT, kb + 2 * KT, true, 2);
    } else if constexpr (ST == 1) {
      if (more) fill(kb + KT, 0, next_rows, kb + KT, kb + 2 * KT, true);
    } else {
      st ^= 1;
    }
  }
  // Each row's sum over its 4 lanes.
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  if constexpr (KW > 1) {
    merge_key_warps<DH, KW, ST>(o, m0, m1, l0, l1, own_raw, regions, G, kvh, t, split, p, out);
  } else {
    // Rows g and g + 8 are heads kvh · G + g and + 8 when below G; this
    // warp's dims start at warp · DO (every warp computed the same m and l).
#pragma unroll
    for (int half = 0; half < QR / 8; ++half) {
      const int r = g + 8 * half;
      if (p.out_quantized && p.splits == 1)  // every lane: the rows' lanes shuffle
        store_row_quantized(p, o, half, half ? l1 : l0, t, int64_t(kvh) * G + r, DH, warp * DO,
                            r < G);
      if (r >= G) continue;
      store_row_fragment(p, out, o, half, half ? m1 : m0, half ? l1 : l0, t, int64_t(kvh) * G + r,
                         split, DH, warp * DO, tq, warp == 0 && tq == 0, p.splits == 1);
    }
  }
}

template <int DH, int KW, int ST>
void launch_decode_warps(dim3 grid, const float* q, const StepLayout& at, const PagedAttention& p,
                         float* out, cudaStream_t stream) {
  using S = DecodeShape<DH>;
  const auto kernel = p.bf16_inputs ? decode_attention_kernel<DH, KW, ST, true>
                                    : decode_attention_kernel<DH, KW, ST, false>;
  constexpr size_t smem = S::smem_bytes(KW, ST);
  if constexpr (smem > (size_t(48) << 10))
    allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
  launch(kernel, grid, 32 * S::kWarps * KW, smem, stream, q, at, p, out);
}

template <int DH>
void launch_decode(dim3 grid, const float* q, const StepLayout& at, const PagedAttention& p,
                   float* out, cudaStream_t stream) {
  using S = DecodeShape<DH>;
  constexpr int kMax = S::kMaxKeyWarps;
  if (kMax > 1 && p.key_warps > 1) {
    // Two stages while the grid leaves each SM at most one block; past
    // that, one (half the shared memory: two blocks of key warps fit an
    // SM). Measured on the H200 (tok/s, two stages → one): 32 sequences
    // at context 1024, llama-3.2-1b 17,253 → 17,699, qwen3-1.7b 8,623 →
    // 9,253, ministral-3-3b 6,919 → 7,342; batch 1 (64 blocks or fewer) at
    // context 4096, llama 941 → 890, qwen3 575 → 540.
    const bool fills_sms =
        p.multiprocessors > 0 && int64_t(grid.x) * grid.y > int64_t(p.multiprocessors);
    if (S::stages(kMax) == 1 || fills_sms)
      launch_decode_warps<DH, kMax, 1>(grid, q, at, p, out, stream);
    else
      launch_decode_warps<DH, kMax, 2>(grid, q, at, p, out, stream);
  } else {
    launch_decode_warps<DH, 1, 2>(grid, q, at, p, out, stream);
  }
}

// Resident one-warp blocks (KW 1, two stages) of dim DH per SM, queried
// once per shape on the first device that asks (a host mixing GPU models
// would size the others' splits by it: a speed, not a correctness, matter),
// for the bf16-input variant (the other takes the same shared memory,
// which is what bounds them).
template <int DH>
int one_warp_blocks_per_sm() {
  static const int blocks = [] {
    using S = DecodeShape<DH>;
    const auto kernel = decode_attention_kernel<DH, 1, 2, true>;
    constexpr size_t smem = S::smem_bytes(1, 2);
    if constexpr (smem > (size_t(48) << 10))
      allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 32 * S::kWarps, smem));
    return n;
  }();
  return blocks;
}

}  // namespace

int attention_decode_one_warp_blocks_per_sm(const PagedAttention& p) {
  switch (p.head_dim) {
    case 64: return one_warp_blocks_per_sm<64>();
    case 128: return one_warp_blocks_per_sm<128>();
    case 256: return one_warp_blocks_per_sm<256>();
    default: return one_warp_blocks_per_sm<512>();
  }
}

bool attention_decode_mma_supported(const PagedAttention& p) {
  // Tensor cores of sm_80+ on the device in use, unless switched off.
  static const bool enabled = [] {
    const char* e = std::getenv("TANDEM_CUDA_DECODE_MMA");
    return !(e && e[0] == '0');
  }();
  if (!enabled || current_launch_limits().cc_major < 8) return false;
  if (!p.kv_bf16 || p.kv_heads <= 0 || p.heads % p.kv_heads != 0) return false;
  const int64_t group = p.heads / p.kv_heads;
  switch (p.head_dim) {
    case 64: return group <= DecodeShape<64>::kQRows;
    case 128: return group <= DecodeShape<128>::kQRows;
    case 256: return group <= DecodeShape<256>::kQRows;
    case 512: return group <= DecodeShape<512>::kQRows;
    default: return false;
  }
}

int attention_decode_key_warps(const PagedAttention& p) {
  switch (p.head_dim) {
    case 64: return DecodeShape<64>::kMaxKeyWarps;
    case 128: return DecodeShape<128>::kMaxKeyWarps;
    case 256: return DecodeShape<256>::kMaxKeyWarps;
    default: return 1;
  }
}

int attention_decode_tile_keys(const PagedAttention& p) {
  return tile_keys(int(p.head_dim));
}

void attention_decode_mma(const float* q, int64_t n, const StepLayout& at, const PagedAttention& p,
                          float* out, cudaStream_t stream) {
  if (n <= 0) return;
  if (!attention_decode_mma_supported(p))
    fail("attention_decode_mma: heads %lld / kv_heads %lld of dim %lld over %s rows unsupported",
         (long long)p.heads, (long long)p.kv_heads, (long long)p.head_dim,
         p.kv_bf16 ? "bf16" : "f32");
  if (p.key_warps != 1 && p.key_warps != attention_decode_key_warps(p))
    fail("attention_decode_mma: %d key warps at head dim %lld (1 or %d)", p.key_warps,
         (long long)p.head_dim, attention_decode_key_warps(p));
  const dim3 grid(unsigned(n * p.kv_heads), unsigned(p.splits));
  if (p.head_dim == 64)
    launch_decode<64>(grid, q, at, p, out, stream);
  else if (p.head_dim == 128)
    launch_decode<128>(grid, q, at, p, out, stream);
  else if (p.head_dim == 256)
    launch_decode<256>(grid, q, at, p, out, stream);
  else
    launch_decode<512>(grid, q, at, p, out, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
