// Decode attention for small grids (PagedAttention::chunked): attention_paged's
// contract on tensor cores for a kv head's query heads of one token, where
// a block takes its split's keys in chunks of 128 and its warps share each
// chunk — the scores split over the warps by key, the weighted values by
// output dim.
//
// Why: attention_decode.cu gives each warp its own keys and every output
// dim, so a warp's work grows with the head dim (a head-dim 256 warp runs
// 32 n-tiles of values and the block merges 8 warps' outputs through
// shared memory). With one or a few (token, kv head) units a step (batch
// 1-8 of Gemma 3's and Gemma 4's one kv head), that block is the whole
// grid, and its time is one warp's instruction chain (13.6 us a layer for
// gemma-3-1b's 128 keys in the thirteenth session's profile), not the
// rows' bytes. Here a warp's chain is its keys' scores (16 or 32 keys over
// the head dim) plus its dims' values (16 or 32 dims over the chunk): no
// merge, and the chunk's rows are copied at once (one bulk copy per K and V
// row on sm_90, cp.async before).
//
// A chunk: copy its K and V rows (V rows past the split's end zeroed:
// weighted 0); each warp scores its keys (q · scale as
// bf16, or hi/lo parts, the mma's A rows are the query heads, rows past G
// zeros); the block's row maxima through shared memory; each warp turns
// its scores into weights against the new maxima and stores them (bf16 or
// hi/lo) in shared memory with its row sums; then each warp rescales its
// output dims and adds weights · V over the chunk's keys. Every warp
// derives the same running max and sum from shared memory, so the end
// needs no merge: a warp writes its dims of the final output (splits == 1)
// or of the split's partial for the combine kernel.
//
// With bulk copies a chunk's K rows and V rows land on mbarriers of their
// own: the scores wait for the K rows only, the next chunk's K rows go out
// as soon as every warp's scores are done (while this chunk's weights and
// values are formed), and its V rows once the values are summed. Measured
// alone (bench_cuda_attention --chunked-only, H100, session 38): +6-15%
// where a block takes several chunks (32 sequences x 1,024 keys 23.3 ->
// 21.4 us, x 4,096 63.9 -> 55.7 us; one sequence of qwen3-1.7b's shape at
// 4,096 16.9 -> 15.9 us), the same with one chunk a block.
//
// In decode steps it can also do qkv_post's work (fused_qkv_post): the
// block reads the raw q/k/v projection, norms, rotates and scales its query
// heads straight into shared memory, and the block whose split holds the
// token's position computes the new K and V rows, writes them to the
// caches and places them in its chunk itself (not copied back): one kernel
// fewer a layer.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "backend/cuda/attention_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"
#include "backend/cuda/qkv_post.h"
#include "backend/cuda/reduce.h"

namespace tandem::cuda {

namespace {

constexpr int kChunkKeys = 128;
constexpr int kRows = 16;  // mma rows: query heads of a kv head, at most
constexpr int kPad = 8;    // bf16 row padding: ldmatrix rows hit distinct banks

// The block's shape for head dim DH (64, 128 or 256): warps, each warp's
// keys of a chunk (its score n-tiles · 8) and output dims (its value
// n-tiles · 8, at least 16: the values' ldmatrix takes two n-tiles).
template <int DH>
struct ChunkShape {
  static constexpr int kWarps = DH >= 128 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeysPerWarp = kChunkKeys / kWarps;
  static constexpr int kDimsPerWarp = DH / kWarps;
  static constexpr int kPitch = DH + kPad;                // q, K and V rows
  static constexpr int kWeightPitch = kChunkKeys + kPad;  // weight rows
  // Shared memory, in this order: q hi, q lo [kRows][kPitch] bf16; K, V
  // [kChunkKeys][kPitch] bf16; weights hi, lo [kRows][kWeightPitch] bf16;
  // row maxima, row sums [kWarps][kRows] f32; the token's new K and V rows
  // [2][DH] bf16 (with a fused qkv post); the mbarriers of the chunk's K
  // rows and of its V rows.
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(2) * 2 * kRows * kPitch;
  static constexpr size_t kV = kK + size_t(2) * kChunkKeys * kPitch;
  static constexpr size_t kWeights = kV + size_t(2) * kChunkKeys * kPitch;
  static constexpr size_t kStats = kWeights + size_t(2) * 2 * kRows * kWeightPitch;
  static constexpr size_t kOwnRows = kStats + size_t(4) * 2 * kWarps * kRows;  // [2][DH] bf16
  static constexpr size_t kBarrier = kOwnRows + size_t(2) * 2 * DH;
  static constexpr size_t kBytes = kBarrier + 16;
  // A split's partial as another block of its cluster hands it over
  // (merge_in_cluster): each thread's output fragments (its DPW / 8 n-tiles
  // of 4 values) and its rows' m0, m1, l0, l1, stored value-major ([value]
  // [thread]) so a warp's stores hit consecutive words. Split s > 0 writes
  // slot s - 1 of the cluster's first block, past kBytes.
  static constexpr int kSlotValues = kDimsPerWarp / 8 * 4 + 4;
  static constexpr size_t kSlotBytes = size_t(4) * kSlotValues * kThreads;
  static_assert(kKeysPerWarp % 16 == 0 && kDimsPerWarp % 16 == 0, "whole ldmatrix pairs");
  static_assert(kBarrier % 8 == 0 && (kPitch * 2) % 16 == 0, "aligned rows and barrier");
  static_assert(kChunkKeys <= kThreads, "a thread per key row");
};

// What a lane of the fused qkv post takes before the PDL wait (weights and
// the step's inputs only), for dims lane + 32j of a head: its RoPE angles
// (pairs j < DH / 64) and the q and k norm weights (1 without).
template <int DH>
struct FusedLane {
  float cs[DH / 64], sn[DH / 64], wq[DH / 32], wk[DH / 32];
  // Every load goes out before the first sincosf: its slow path (large
  // arguments) is a branch the compiler does not hoist loads across, so
  // loading each frequency beside its sincosf made four L2 round trips in
  // a row (ncu, gemma-3-1b, session 29).
  __device__ __forceinline__ void init(const QkvPost& post, int64_t pos, int lane) {
    float freq[DH / 64];
#pragma unroll
    for (int j = 0; j < DH / 64; ++j) freq[j] = __ldg(post.inv_freq + lane + 32 * j);
#pragma unroll
    for (int j = 0; j < DH / 32; ++j) {
      wq[j] = post.q_norm ? __ldg(post.q_norm + lane + 32 * j) : 1.f;
      wk[j] = post.k_norm ? __ldg(post.k_norm + lane + 32 * j) : 1.f;
    }
#pragma unroll
    for (int j = 0; j < DH / 64; ++j) sincosf(float(pos) * freq[j], &sn[j], &cs[j]);
  }
};

// qkv_post's work for token t and kv head kvh, inside the chunked kernel
// (attention_paged with a QkvPost: decode steps, one token per sequence).
// Warp w takes heads w, w + NW, ... of: the G query heads, then, when
// `new_kv` (this block's split holds the token's own position), the kv
// head's K and V — all its heads' loads first, so a warp with two or three
// heads waits for L2 once. A lane holds dims lane + 32j of a head: the
// norm's sum is a warp sum and RoPE's pairs (i, i + DH / 2: the rotation
// covers the head) stay in the lane (angles and weights in `f`, taken
// before the PDL wait). Query heads go to q_hi / q_lo as q · temperature ·
// scale parts (rows G-15 zeroed by the block); K and V rows go to the
// caches (bf16) and to own_k / own_v, from which the same lanes place them
// in their chunk's rows (place_own_rows).
template <int DH, int NW, bool BQ>
__device__ __forceinline__ void fused_qkv_post(const float* qkv, const QkvPost& post, float scale,
                                               int64_t t, int64_t pos, int kvh, int G, bool new_kv,
                                               size_t own_row, const FusedLane<DH>& f,
                                               uint16_t* q_hi, uint16_t* q_lo, int pitch,
                                               uint16_t* own_k, uint16_t* own_v) {
  constexpr int LD = DH / 32;                         // dims a lane holds
  constexpr int kRounds = (kRows + 2 + NW - 1) / NW;  // heads a warp takes, at most
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < (kRows - G) * DH; i += 32 * NW) {
    q_hi[(G + i / DH) * pitch + i % DH] = 0;
    if constexpr (!BQ) q_lo[(G + i / DH) * pitch + i % DH] = 0;
  }
  const float* row = qkv + t * post.stride;
  const int heads = G + (new_kv ? 2 : 0);
  auto kind_of = [&](int hh) { return hh < G ? kQuery : hh == G ? kKey : kValue; };
  float x[kRounds][LD];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int hh = warp + r * NW, kind = kind_of(hh);
    if (hh >= heads) break;
    const int64_t col = qkv_column(post, kind, kind == kQuery ? int64_t(kvh) * G + hh : kvh);
#pragma unroll
    for (int j = 0; j < LD; ++j) x[r][j] = row[col + lane + 32 * j];
  }
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int hh = warp + r * NW, kind = kind_of(hh);
    if (hh >= heads) break;
    if (kind == kValue ? post.v_norm : post.qk_norm) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < LD; ++j) ss += x[r][j] * x[r][j];
      const float rs = rsqrtf(warp_sum(ss) / float(DH) + post.eps);
#pragma unroll
      for (int j = 0; j < LD; ++j)
        x[r][j] = x[r][j] * rs * (kind == kQuery ? f.wq[j] : kind == kKey ? f.wk[j] : 1.f);
    }
    if (kind < kValue) {  // RoPE over the whole head (attention_decode_chunked_fuses_post)
#pragma unroll
      for (int j = 0; j < LD / 2; ++j) {
        const float c = f.cs[j] * post.rope_scaling, s = f.sn[j] * post.rope_scaling;
        const float a = x[r][j], b = x[r][j + LD / 2];
        x[r][j] = a * c - b * s;
        x[r][j + LD / 2] = b * c + a * s;
      }
    }
    if (kind == kQuery) {
      const float temp = query_temperature(post, pos);
#pragma unroll
      for (int j = 0; j < LD; ++j) {
        uint32_t hi, lo;
        split(x[r][j] * temp * scale, hi, lo);
        q_hi[hh * pitch + lane + 32 * j] = uint16_t(hi);
        if constexpr (!BQ) q_lo[hh * pitch + lane + 32 * j] = uint16_t(lo);
      }
    } else {
      uint16_t* cache = static_cast<uint16_t*>(kind == kKey ? post.k_cache : post.v_cache);
      uint16_t* own = kind == kKey ? own_k : own_v;
#pragma unroll
      for (int j = 0; j < LD; ++j) {
        const uint16_t b = kv_bf16_bits(x[r][j]);
        cache[own_row + lane + 32 * j] = b;
        own[lane + 32 * j] = b;
      }
    }
  }
}

// The splits of a (token, kv head) merged inside their thread-block
// cluster (PagedAttention::merge_in_cluster: the splits are one cluster,
// rank = split), instead of by the combine kernel after the grid. Every
// block but the first writes its threads' fragments, m and l (ChunkShape's
// slot layout) into slot rank - 1 of the first block's shared memory
// (`slots`, distributed shared memory); the cluster barrier publishes them;
// the first block folds each slot into its own fragments, rescaled to the
// larger running max, as the combine kernel does. Returns whether this block
// holds the merged rows (the first). The barrier's first phase was armed at
// the kernel's start (a relaxed arrive) and is waited on before any remote
// store: a block's shared memory exists only once it runs. Every thread of
// the block must call it.
template <int NO>
__device__ __forceinline__ bool merge_cluster_splits(float (&o)[NO][4], float& m0, float& m1,
                                                     float& l0, float& l1, float* slots) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kValues = NO * 4 + 4;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const unsigned rank = __clusterRelativeBlockRank();
  __cluster_barrier_wait();  // every block of the cluster has started
  if (rank != 0) {
    float* slot = static_cast<float*>(__cluster_map_shared_rank(slots, 0)) +
                  size_t(rank - 1) * kValues * nt + tid;
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) slot[(4 * n + e) * nt] = o[n][e];
    slot[(4 * NO) * nt] = m0;
    slot[(4 * NO + 1) * nt] = m1;
    slot[(4 * NO + 2) * nt] = l0;
    slot[(4 * NO + 3) * nt] = l1;
  }
  __cluster_barrier_arrive();  // release: this block's slot stores
  __cluster_barrier_wait();    // acquire: every block's
  if (rank != 0) return false;
  const unsigned blocks = __clusterSizeInBlocks();
  for (unsigned r = 1; r < blocks; ++r) {
    const float* slot = slots + size_t(r - 1) * kValues * nt + tid;
    const float pm0 = slot[(4 * NO) * nt], pm1 = slot[(4 * NO + 1) * nt];
    const float n0 = fmaxf(m0, pm0), n1 = fmaxf(m1, pm1);  // finite: m starts at -FLT_MAX
    const float a0 = expf(m0 - n0), b0 = expf(pm0 - n0);
    const float a1 = expf(m1 - n1), b1 = expf(pm1 - n1);
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      o[n][0] = o[n][0] * a0 + slot[(4 * n) * nt] * b0;
      o[n][1] = o[n][1] * a0 + slot[(4 * n + 1) * nt] * b0;
      o[n][2] = o[n][2] * a1 + slot[(4 * n + 2) * nt] * b1;
      o[n][3] = o[n][3] * a1 + slot[(4 * n + 3) * nt] * b1;
    }
    l0 = l0 * a0 + slot[(4 * NO + 2) * nt] * b0;
    l1 = l1 * a1 + slot[(4 * NO + 3) * nt] * b1;
    m0 = n0;
    m1 = n1;
  }
  return true;
#else
  __trap();  // the host launches clusters on sm_90+ only
  return false;
#endif
}

// grid: (tokens · kv heads, splits); ChunkShape<DH>::kThreads threads;
// ChunkShape<DH>::kBytes of shared memory. BQ: q·scale and the weights
// rounded to bf16 (PagedAttention::bf16_inputs), else hi/lo parts. BULK:
// one bulk copy per row (sm_90), else cp.async per 16 bytes. merge: the
// grid's y is one cluster (merge_cluster_splits; sm_90+), and the shared
// memory holds (splits - 1) slots past ChunkShape<DH>::kBytes.
template <int DH, bool BQ, bool BULK>
__global__ void __launch_bounds__(ChunkShape<DH>::kThreads)
    chunked_decode_kernel(const float* q, StepLayout at, PagedAttention p, QkvPost post, bool fused,
                          bool merge, float* __restrict__ out) {
  using S = ChunkShape<DH>;
  constexpr int NT = S::kThreads, NW = S::kWarps, KPW = S::kKeysPerWarp, DPW = S::kDimsPerWarp;
  constexpr int P = S::kPitch, WP = S::kWeightPitch, C = kChunkKeys;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kBulk = BULK;
#else
  constexpr bool kBulk = false;
#endif
  extern __shared__ __align__(16) uint8_t shared_raw[];
  uint16_t* q_hi = reinterpret_cast<uint16_t*>(shared_raw + S::kQ);
  uint16_t* q_lo = q_hi + kRows * P;
  uint16_t* k_rows = reinterpret_cast<uint16_t*>(shared_raw + S::kK);
  uint16_t* v_rows = reinterpret_cast<uint16_t*>(shared_raw + S::kV);
  uint16_t* w_hi = reinterpret_cast<uint16_t*>(shared_raw + S::kWeights);
  uint16_t* w_lo = w_hi + kRows * WP;
  float* row_max = reinterpret_cast<float*>(shared_raw + S::kStats);  // [NW][kRows]
  float* row_sum = row_max + NW * kRows;
  uint16_t* own_k = reinterpret_cast<uint16_t*>(shared_raw + S::kOwnRows);
  uint16_t* own_v = own_k + DH;
  uint64_t* bars = reinterpret_cast<uint64_t*>(shared_raw + S::kBarrier);  // K, V
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  pdl_launch_dependents();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (merge) __cluster_barrier_arrive_relaxed();  // waited on in merge_cluster_splits
#endif
  const int G = int(p.heads / p.kv_heads);
  const int64_t t = blockIdx.x / p.kv_heads;
  const int kvh = int(blockIdx.x % p.kv_heads), split = int(blockIdx.y);
  const KeyRange keys = split_keys(at, p, t, split);
  const int first = int(keys.first), end = int(keys.end);
  const PagedRows rows = paged_rows(at, p, t, kvh);
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v_base);
  // fused: this block computes the token's new K and V rows when its split
  // holds the token's position (`skip`: that key is placed, not copied);
  // this lane's RoPE angles and norm weights, before the PDL wait.
  const int64_t pos = at.positions[t];
  const bool new_kv = fused && post.own_kv && pos >= first && pos < end;
  const int skip = new_kv ? int(pos) : -1;
  FusedLane<DH> lane_post;
  if (fused) lane_post.init(post, pos, lane);

  // The chunk at kb's keys in [from, to) into the K rows (keys) or the V
  // rows. Bulk copies: thread c copies key kb + c's row on the part's
  // barrier, whose phase thread 0 arms once per chunk (`arm`) for the
  // chunk's rows below the split's end; the V rows past the end up to the
  // values' last 16-key step are zeroed (their weights are 0, and 0 · NaN
  // from stale shared memory would not be). cp.async: the block copies 16
  // bytes at a time of both parts (keys: K and V; the V call does nothing),
  // zeros past the end, as one group. Neither copies key `skip` (placed by
  // place_own_rows).
  auto copy_part = [&](bool keys_part, int kb, int from, int to, bool arm) {
    if constexpr (kBulk) {
      uint64_t* part_bar = keys_part ? bars : bars + 1;
      uint16_t* dst = keys_part ? k_rows : v_rows;
      const uint16_t* base = keys_part ? kbase : vbase;
      const int n_rows = min(C, end - kb), copied = n_rows - (skip >= kb && skip < kb + n_rows);
      if (arm && tid == 0) mbarrier_expect_tx(part_bar, uint32_t(copied * DH * 2));
      const int key = kb + tid;
      if (tid < C && key >= from && key < to && key != skip) {
        if (key < end) {
          fence_async_shared();  // earlier reads of these bytes before the copy overwrites them
          bulk_copy(dst + tid * P, base + rows.row(key), DH * 2, part_bar);
        } else if (!keys_part && tid < (n_rows + 15) / 16 * 16) {
          for (int d = 0; d < DH; d += 8)
            *reinterpret_cast<uint4*>(v_rows + tid * P + d) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    } else if (keys_part) {
      for (int i = tid; i < C * (DH / 8); i += NT) {
        const int c = i / (DH / 8), d = 8 * (i % (DH / 8)), key = kb + c;
        if (key < from || key >= to || key == skip) continue;
        const bool ok = key < end;
        const size_t r = ok ? rows.row(key) + size_t(d) : 0;
        cp_async16(k_rows + c * P + d, kbase + r, ok);
        cp_async16(v_rows + c * P + d, vbase + r, ok);
      }
      cp_async_commit();
    }
  };
  auto copy_chunk = [&](int kb, int from, int to, bool arm) {
    copy_part(true, kb, from, to, arm);
    copy_part(false, kb, from, to, arm);
  };
  // Waits for the chunk's K rows (keys_part) or V rows (cp.async: one group
  // holds both, so the V wait is a no-op). A bulk barrier's copies are then
  // visible to the waiting thread; the block barrier after the K wait
  // publishes the threads' own stores (q, own rows, zeroed rows, cp.async).
  uint32_t parity[2] = {0u, 0u};
  auto wait_part = [&](bool keys_part) {
    if constexpr (kBulk) {
      mbarrier_wait(keys_part ? bars : bars + 1, parity[keys_part ? 0 : 1]);
      parity[keys_part ? 0 : 1] ^= 1u;
    } else if (keys_part) {
      cp_async_wait<0>();
    }
  };

  if constexpr (kBulk) {
    if (tid == 0) {
      mbarrier_init(bars);
      mbarrier_init(bars + 1);
    }
    __syncthreads();
  }
  // The first chunk's keys that no earlier kernel of the step writes go out
  // before the PDL wait (p.one_new_key: all but the token's own position);
  // the rest after it.
  const int stable_end = p.one_new_key ? min(end, int(at.key_end[t]) - 1) : first;
  if (first < stable_end) copy_chunk(first, first, stable_end, true);
  pdl_wait();
  if (first < end) copy_chunk(first, max(first, stable_end), first + C, !(first < stable_end));

  // q · scale of the G heads (rows past G: zeros): staged from q, or, fused,
  // from the raw projection (which also yields the new K and V rows).
  if (fused)
    fused_qkv_post<DH, NW, BQ>(q, post, p.scale, t, pos, kvh, G, new_kv,
                               new_kv ? rows.row(int(pos)) : 0, lane_post, q_hi, q_lo, P, own_k,
                               own_v);
  else
    stage_q_parts<kRows, DH, NT, BQ>(q + t * p.heads * DH + int64_t(kvh) * G * DH, G, p.scale, q_hi,
                                     q_lo, P, tid);
  // The new K and V rows into their slot of the chunk at kb, by the lanes
  // that computed them (before the chunk's barrier publishes them).
  auto place_own_rows = [&](int kb) {
    if (!new_kv || pos < kb || pos >= kb + C) return;
    const int slot = int(pos) - kb;
    if (warp == G % NW)
      for (int d = lane; d < DH; d += 32) k_rows[slot * P + d] = own_k[d];
    if (warp == (G + 1) % NW)
      for (int d = lane; d < DH; d += 32) v_rows[slot * P + d] = own_v[d];
  };

  // This lane's output fragments (rows g and g + 8, the warp's DPW dims)
  // and the rows' running max and sum (the same in every warp).
  float o[DPW / 8][4];
#pragma unroll
  for (int n = 0; n < DPW / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;
  const int mat = lane / 8,
            mrow = lane % 8;  // ldmatrix: lane l addresses row l % 8 of matrix l / 8

  for (int kb = first; kb < end; kb += C) {
    place_own_rows(kb);
    wait_part(true);
    __syncthreads();  // every thread's copies (and, the first time, q and the own rows) visible
    // This warp's scores: keys kb + warp · KPW + [0, KPW).
    float s[KPW / 8][4];
#pragma unroll
    for (int n = 0; n < KPW / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if (kb + warp * KPW < end)  // a warp whose keys are all past the end leaves them masked
      warp_scores<true, KPW / 8, true, BQ>(s, q_hi, q_lo, P, k_rows + warp * KPW * P, nullptr, P,
                                           DH);
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < KPW / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e];
        if (p.softcap > 0.f) v = p.softcap * tanhf(v / p.softcap);
        v = kb + warp * KPW + n * 8 + 2 * tq + (e & 1) < end ? v : -INFINITY;
        s[n][e] = v;
        if (e < 2)
          mx0 = fmaxf(mx0, v);
        else
          mx1 = fmaxf(mx1, v);
      }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    if (tq == 0) {
      row_max[warp * kRows + g] = mx0;
      row_max[warp * kRows + g + 8] = mx1;
    }
    __syncthreads();
    // Every warp's scores are done with the K rows: the next chunk's go out
    // (bulk copies; cp.async copies both parts after the values).
    if (kBulk && kb + C < end) copy_part(true, kb + C, kb + C, kb + 2 * C, true);
    // The rows' new max over the chunk (finite: m starts at -FLT_MAX).
    float n0 = m0, n1 = m1;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      n0 = fmaxf(n0, row_max[w * kRows + g]);
      n1 = fmaxf(n1, row_max[w * kRows + g + 8]);
    }
    const float c0 = expf(m0 - n0), c1 = expf(m1 - n1);
    m0 = n0;
    m1 = n1;
    // Weights exp(s - max) (masked keys: 0) into shared memory as the
    // A operand of the values' product, and this warp's row sums.
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int n = 0; n < KPW / 8; ++n) {
      const float w0 = expf(s[n][0] - n0), w1 = expf(s[n][1] - n0);
      const float w2 = expf(s[n][2] - n1), w3 = expf(s[n][3] - n1);
      sum0 += w0 + w1;
      sum1 += w2 + w3;
      const int col = warp * KPW + n * 8 + 2 * tq;
      uint32_t h01, l01, h23, l23;
      split2(w0, w1, h01, l01);
      split2(w2, w3, h23, l23);
      *reinterpret_cast<uint32_t*>(w_hi + g * WP + col) = h01;
      *reinterpret_cast<uint32_t*>(w_hi + (g + 8) * WP + col) = h23;
      if constexpr (!BQ) {
        *reinterpret_cast<uint32_t*>(w_lo + g * WP + col) = l01;
        *reinterpret_cast<uint32_t*>(w_lo + (g + 8) * WP + col) = l23;
      }
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      sum0 += __shfl_xor_sync(0xffffffffu, sum0, x);
      sum1 += __shfl_xor_sync(0xffffffffu, sum1, x);
    }
    if (tq == 0) {
      row_sum[warp * kRows + g] = sum0;
      row_sum[warp * kRows + g + 8] = sum1;
    }
    __syncthreads();
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      l0 += row_sum[w * kRows + g];
      l1 += row_sum[w * kRows + g + 8];
    }
#pragma unroll
    for (int n = 0; n < DPW / 8; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
    wait_part(false);  // the zeroed and own V rows: visible since the barriers above
    // o += weights · V over the chunk's keys below the end (in 16-key
    // steps), for this warp's dims.
    const int steps = (min(C, end - kb) + 15) / 16;
#pragma unroll 4
    for (int kk = 0; kk < steps; ++kk) {
      const int a_at = (mrow + 8 * (mat % 2)) * WP + kk * 16 + 8 * (mat / 2);
      uint32_t ah[4], al[4] = {0u, 0u, 0u, 0u};
      ldmatrix_x4(ah, w_hi + a_at);
      if constexpr (!BQ) ldmatrix_x4(al, w_lo + a_at);
#pragma unroll
      for (int nd = 0; nd < DPW / 16; ++nd) {
        const int b_at =
            (kk * 16 + 8 * (mat % 2) + mrow) * P + warp * DPW + nd * 16 + 8 * (mat / 2);
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_rows + b_at);
        mma_parts<true, BQ>(o[2 * nd], ah, al, b[0], b[1], 0u, 0u);
        mma_parts<true, BQ>(o[2 * nd + 1], ah, al, b[2], b[3], 0u, 0u);
      }
    }
    if (kb + C < end) {
      __syncthreads();  // every warp is done with this chunk's rows and weights
      if constexpr (kBulk)
        copy_part(false, kb + C, kb + C, kb + 2 * C, true);
      else
        copy_chunk(kb + C, kb + C, kb + 2 * C, true);
    }
  }

  // Whole rows (every key seen) here, or partials for the combine kernel.
  bool whole = p.splits == 1;
  if (merge) {
    whole = merge_cluster_splits<DPW / 8>(o, m0, m1, l0, l1,
                                          reinterpret_cast<float*>(shared_raw + S::kBytes));
    if (!whole) return;
  }
  // Rows g and g + 8 are heads kvh · G + g and + 8 where below G.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= G) continue;
    store_row_fragment(p, out, o, half, half ? m1 : m0, half ? l1 : l0, t, int64_t(kvh) * G + r,
                       split, DH, warp * DPW, tq, warp == 0 && tq == 0, whole);
  }
  if (!p.out_quantized || !whole) return;  // the split combine quantizes
  // The quantized rows (PagedAttention::out_quantized). A warp's dims are
  // whole 32-column blocks at head dim 256; below, a block spans warps, so
  // the rows go through shared memory — the K rows, which no warp reads
  // after the last chunk's scores and no copy still fills — and each warp
  // quantizes whole blocks of them.
  if constexpr (DPW % 32 == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      store_row_quantized(p, o, half, half ? l1 : l0, t, int64_t(kvh) * G + r, DH, warp * DPW,
                          r < G);
    }
  } else {
    float* staged = reinterpret_cast<float*>(k_rows);  // [G][DH]
    static_assert(size_t(kRows) * DH * 4 <= size_t(2) * C * P, "the rows fit the K rows");
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      if (r >= G) continue;
      const float l = half ? l1 : l0, inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
      for (int n = 0; n < DPW / 8; ++n)
        *reinterpret_cast<float2*>(staged + r * DH + warp * DPW + n * 8 + 2 * tq) =
            make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    }
    __syncthreads();
    uint8_t* row = quantized_row(p, t);
    for (int i = warp; i < G * (DH / 32); i += NW) {
      const int r = i / (DH / 32), b = i % (DH / 32);
      store_quantized32(row, int(p.heads * DH), int(((int64_t(kvh) * G + r) * DH) / 32) + b,
                        staged[r * DH + 32 * b + lane]);
    }
  }
}

// merge: the splits as one cluster each, with their slots.
template <int DH, bool BQ, bool BULK>
void launch_chunked(dim3 grid, const float* q, const StepLayout& at, const PagedAttention& p,
                    const QkvPost& post, bool fused, bool merge, float* out, cudaStream_t stream) {
  using S = ChunkShape<DH>;
  const auto kernel = chunked_decode_kernel<DH, BQ, BULK>;
  static_assert(S::kBytes > (size_t(48) << 10), "opts in to more than 48 KiB");
  allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
  const size_t bytes = S::kBytes + (merge ? size_t(p.splits - 1) * S::kSlotBytes : 0);
  launch_clustered(kernel, grid, S::kThreads, bytes, stream, merge ? dim3(1, grid.y) : dim3(1), q,
                   at, p, post, fused, merge, out);
}

template <int DH>
void launch_chunked(dim3 grid, const float* q, const StepLayout& at, const PagedAttention& p,
                    const QkvPost& post, bool fused, bool bulk, bool merge, float* out,
                    cudaStream_t stream) {
  if (p.bf16_inputs) {
    if (bulk)
      launch_chunked<DH, true, true>(grid, q, at, p, post, fused, merge, out, stream);
    else
      launch_chunked<DH, true, false>(grid, q, at, p, post, fused, merge, out, stream);
  } else {
    if (bulk)
      launch_chunked<DH, false, true>(grid, q, at, p, post, fused, merge, out, stream);
    else
      launch_chunked<DH, false, false>(grid, q, at, p, post, fused, merge, out, stream);
  }
}

// The most splits of one cluster at head dim DH: the slots of all but the
// first must fit beside the kernel's own shared memory, and a portable
// cluster has at most 8 blocks.
template <int DH>
int cluster_max_splits() {
  using S = ChunkShape<DH>;
  const size_t optin = current_launch_limits().smem_optin;
  if (!clusters_supported() || optin < S::kBytes) return 1;
  return int(std::min<size_t>(8, 1 + (optin - S::kBytes) / S::kSlotBytes));
}

}  // namespace

bool attention_decode_chunked_supported(const PagedAttention& p) {
  if (!attention_decode_mma_supported(p))
    return false;  // sm_80+, bf16 rows, ≤ 16 heads per kv head
  return p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256;
}

int attention_decode_chunked_warps(int64_t head_dim) {
  return head_dim >= 128 ? ChunkShape<128>::kWarps : ChunkShape<64>::kWarps;
}

int attention_decode_chunk_keys() {
  return kChunkKeys;
}

int attention_decode_cluster_max_splits(int64_t head_dim) {
  if (head_dim == 64) return cluster_max_splits<64>();
  if (head_dim == 128) return cluster_max_splits<128>();
  if (head_dim == 256) return cluster_max_splits<256>();
  return 1;
}

bool attention_decode_chunked_merges(const PagedAttention& p) {
  return p.chunked && p.merge_in_cluster && p.splits > 1;
}

bool attention_decode_chunked_fuses_post(const PagedAttention& p, const QkvPost& post) {
  return attention_decode_chunked_supported(p) && p.one_new_key && post.kv_bf16 &&
         post.head_dim == p.head_dim && post.heads == p.heads && post.kv_heads == p.kv_heads &&
         post.rotary_dim == p.head_dim &&
         (!post.own_kv || (post.k_cache == p.k_base && post.v_cache == p.v_base));
}

void attention_decode_chunked(const float* q, int64_t n, const StepLayout& at,
                              const PagedAttention& p, float* out, cudaStream_t stream,
                              const QkvPost* post) {
  if (n <= 0) return;
  if (!attention_decode_chunked_supported(p))
    fail(
        "attention_decode_chunked: heads %lld / kv_heads %lld of dim %lld over %s rows unsupported",
        (long long)p.heads, (long long)p.kv_heads, (long long)p.head_dim,
        p.kv_bf16 ? "bf16" : "f32");
  if (post && !attention_decode_chunked_fuses_post(p, *post))
    fail(
        "attention_decode_chunked: cannot fuse this qkv post (decode steps over bf16 rows with "
        "RoPE over the whole head of %lld dims only; rotary dims %lld)",
        (long long)p.head_dim, (long long)post->rotary_dim);
  const bool merge = attention_decode_chunked_merges(p);
  if (merge && p.splits > attention_decode_cluster_max_splits(p.head_dim))
    fail(
        "attention_decode_chunked: %d splits of head dim %lld cannot merge in one cluster (at "
        "most %d on this device; clear merge_in_cluster to merge with the combine kernel)",
        p.splits, (long long)p.head_dim, attention_decode_cluster_max_splits(p.head_dim));
  const bool bulk = current_launch_limits().cc_major >= 9 && !p.cp_async_only;
  const dim3 grid(unsigned(n * p.kv_heads), unsigned(p.splits));
  const QkvPost none;
  const QkvPost& qp = post ? *post : none;
  if (p.head_dim == 64)
    launch_chunked<64>(grid, q, at, p, qp, post != nullptr, bulk, merge, out, stream);
  else if (p.head_dim == 128)
    launch_chunked<128>(grid, q, at, p, qp, post != nullptr, bulk, merge, out, stream);
  else
    launch_chunked<256>(grid, q, at, p, qp, post != nullptr, bulk, merge, out, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
