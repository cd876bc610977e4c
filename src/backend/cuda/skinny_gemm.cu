// The decode GEMM of up to 32 tokens over bf16 weights and bf16 activations
// (the decoder gives it steps of 3 to 16 tokens under --gemm-precision bf16,
// the default):
// y[t, r] = Σ_k x[t, k] · W[r, k], f32 sums on tensor cores (mma m16n8k16),
// every weight read once, from registers straight into the mma — no shared
// memory tiles, no block barrier until the end. At these widths cuBLAS
// picks tiles made for wide products and streams the weights below the
// bandwidth; the fused GEMV (gemv.cu) runs its 4-8 tokens on CUDA cores and
// is bound by its multiply-adds. Measured on the H200 against cuBLAS
// (context 1,024): +3-7% at 4 and 8 sequences, +1.4% at 16; 11-21% behind at
// 32 (every block rereads all the tokens' activations: large matrices turn
// L2-bound), so the decoder gives it steps of up to 16.
//
// A block takes 16 weight rows (or RG groups of 16: skinny_gemm_kernel); its
// 8 warps split the columns, 64 at a
// step. Lane (g = lane / 4, q = lane % 4) loads row g's and row g + 8's
// columns 16q .. 16q + 15 of the step (32 bytes each; the 4 lanes of a row
// read 64 contiguous bytes) and, for each 8-token mma tile t, token
// 8t + g's same columns (tokens past n are zeros); a round's activation
// loads all go out before its first mma (loaded one step at a time, 16
// tokens lost 10% to cuBLAS; issued together, they win).
// The dot product does not care in which order the columns are summed, so
// the step's 64 columns are fed to the mma in a permuted order: for k-slice
// j (0..3) the lane's operand pairs are its columns 16q + 4j + {0, 1} (the
// mma's k = 2q, 2q + 1) and 16q + 4j + {2, 3} (k = 2q + 8, 2q + 9), the same
// columns for the weights (A) and the activations (B), so each product
// pairs a weight with its own activation. The first steps' weight loads go
// out before the PDL wait.
//
// Column splits (col_splits > 1, sm_90): a unit's columns are shared by the
// warps of a thread-block cluster of col_splits blocks instead of one
// block's 8, and the epilogue sums every block's partial tiles through
// distributed shared memory, in a fixed order (deterministic). A matrix of
// few rows (gemma-3-1b's down projection: 72 units of 16 rows for 6,912
// columns) otherwise runs on 72 of 132 SMs, one block each: its 32-token
// step streamed 33% of the DRAM bandwidth (ncu, H100, session 28).
//
// Gated (skinny_gemm_gated_bf16): a block's 16 rows are 8 gate rows and the
// 8 up rows that pair with them (F rows further), so the mma's row g and
// row g + 8 meet in one lane and the epilogue writes act(gate) · up — the
// gated MLP's activation without a kernel of its own. Times
// (skinny_gemm_times_bf16): the plain product's epilogue writes act(y) ·
// times[t, r] instead — Gemma 4's per-layer gate, whose activation
// multiplies the token's per-layer input.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/activations.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kStepCols = 64;  // columns a warp consumes per step
// Steps of weight loads in flight per lane (64 bytes each): 4 measured
// 2-5% slower than 2 on the H200 at 4 and 8 tokens (llama-3.2-1b,
// ministral-3-3b, qwen3-1.7b).
constexpr int kUnroll = 2;

// A lane's 16 columns of one row (or token) in a step: 8 bf16 pairs.
struct Cols16 {
  uint4 lo, hi;
  __device__ uint32_t pair(int p) const {
    const uint4& v = p < 4 ? lo : hi;
    const int i = p % 4;
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
  }
};

__device__ __forceinline__ Cols16 load_weights(const uint16_t* p, bool valid) {
  Cols16 c;
  if (valid) {
    c.lo = __ldg(reinterpret_cast<const uint4*>(p));
    c.hi = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  } else {
    c.lo = c.hi = make_uint4(0, 0, 0, 0);
  }
  return c;
}

// Activations are written by the kernel before (plain loads: launch.h).
__device__ __forceinline__ Cols16 load_acts(const uint16_t* p, bool valid) {
  Cols16 c;
  if (valid) {
    c.lo = reinterpret_cast<const uint4*>(p)[0];
    c.hi = reinterpret_cast<const uint4*>(p)[1];
  } else {
    c.lo = c.hi = make_uint4(0, 0, 0, 0);
  }
  return c;
}

// TILES: 8-token mma tiles (tokens 8t + g of tile t), up to 4. GATED: m
// outputs from 2m rows (gate rows, then up rows), act() applied, also
// written rounded to bf16 to y_bf16 when set (same layout as y). Not GATED,
// with `times`: act(sum) · times[token · times_stride + row] (and its bf16
// copy likewise).
// RG: row groups a block takes (16 weight rows, or 8 gate/up pairs, each),
// its warps in RG teams of kWarps / RG that split the columns. Teams read
// the same activation columns at the same steps, so all but the first can
// find them in L1: with one group a block, the 32 tokens' activations cost
// L2 twice the weights' bytes.
// splits: blocks of a cluster that share a unit's columns (RG == 1 only;
// consecutive blocks along x, launched as one cluster; 1: no cluster).
template <int TILES, bool GATED, int RG>
__global__ void __launch_bounds__(kWarps * 32)
    skinny_gemm_kernel(const uint16_t* __restrict__ W, int m, int cols, const uint16_t* x, int n,
                       float* y, int64_t ldy, GemvGate act, uint16_t* y_bf16, const float* times,
                       int64_t times_stride, int splits) {
  constexpr int KW = kWarps / RG;  // warps of a team
  __shared__ float partial[kWarps][TILES][32][4];
  pdl_launch_dependents();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, q = lane % 4;
  const int team = warp / KW, team_warp = warp % KW;
  const int rank = int(blockIdx.x) % splits, unit_block = int(blockIdx.x) / splits;
  // The team's first output row; rows past m read the last row (never
  // stored).
  const int r0 = (unit_block * RG + team) * (GATED ? 8 : 16);
  const int row_a = min(r0 + g, m - 1),
            row_b = GATED ? m + min(r0 + g, m - 1) : min(r0 + g + 8, m - 1);
  const uint16_t* wa = W + size_t(row_a) * size_t(cols) + 16 * q;
  const uint16_t* wb = W + size_t(row_b) * size_t(cols) + 16 * q;
  // This warp's steps [s0, s1) of the row's ceil(cols / 64), shared by
  // the KW warps of each of the cluster's `splits` blocks.
  const int steps = (cols + kStepCols - 1) / kStepCols, sharers = KW * splits;
  const int per = (steps + sharers - 1) / sharers;
  const int s0 = min((rank * KW + team_warp) * per, steps), s1 = min(s0 + per, steps);
  auto valid = [&](int s) { return s * kStepCols + 16 * q < cols; };  // cols % 16 == 0

  // Both rows' columns of steps s .. s + kUnroll - 1 (zeros past s1).
  Cols16 a[kUnroll][2];
  auto load_round = [&](int s) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const bool ok = s + u < s1 && valid(s + u);
      a[u][0] = load_weights(wa + (s + u) * kStepCols, ok);
      a[u][1] = load_weights(wb + (s + u) * kStepCols, ok);
    }
  };
  load_round(s0);
  pdl_wait();
  float acc[TILES][4] = {};
  for (int s = s0; s < s1; s += kUnroll) {
    if (s != s0) load_round(s);
    // Every activation load of the round goes out before the first mma.
    Cols16 b[kUnroll][TILES];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const int token = 8 * t + g;
        const bool ok = s + u < s1 && valid(s + u) && token < n;
        b[u][t] = load_acts(
            x + size_t(token < n ? token : 0) * size_t(cols) + (s + u) * kStepCols + 16 * q, ok);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s + u >= s1) break;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t frag[4] = {a[u][0].pair(2 * j), a[u][1].pair(2 * j), a[u][0].pair(2 * j + 1),
                                  a[u][1].pair(2 * j + 1)};
#pragma unroll
        for (int t = 0; t < TILES; ++t)
          mma(acc[t], frag, b[u][t].pair(2 * j), b[u][t].pair(2 * j + 1));
      }
    }
  }
  // The warps' partial tiles, summed: c0, c1 are row g, tokens 8t + 2q
  // and 8t + 2q + 1; c2, c3 row g + 8.
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][t][lane][i] = acc[t][i];
  __syncthreads();
  // The partial tiles of the cluster's block `r` (this block's own when
  // there is no cluster); after the cluster barrier every block's are
  // final, and the last barrier keeps them alive until all are read.
  using Tiles = float[TILES][32][4];
  Tiles* mine = partial;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  if (splits > 1) cg::this_cluster().sync();
  auto block_tiles = [&](int r) -> const Tiles* {
    return splits > 1 ? cg::this_cluster().map_shared_rank(mine, r) : mine;
  };
#else
  if (splits > 1) __trap();  // the host launches clusters on sm_90+ only
  auto block_tiles = [&](int) -> const Tiles* { return mine; };
#endif
  // Σ over the cluster's blocks (in rank order) and team tm's warps of
  // element [t][l][i].
  auto summed = [&](int tm, int t, int l, int i) {
    float sum = 0.f;
    for (int r = 0; r < splits; ++r) {
      const Tiles* p = block_tiles(r);
#pragma unroll
      for (int w = tm * KW; w < tm * KW + KW; ++w) sum += p[w][t][l][i];
    }
    return sum;
  };
  // Element e of the epilogue belongs to team e / per_team, whose warps'
  // partial tiles it sums; the cluster's blocks take every splits-th
  // stride of the elements.
  const int e0 = rank * kWarps * 32 + int(threadIdx.x), stride = splits * kWarps * 32;
  if constexpr (GATED) {
    // c0 / c1 are gate row g's sums for tokens 8t + 2q and 8t + 2q + 1, c2 /
    // c3 the up row's.
    constexpr int per_team = TILES * 32 * 2;
    for (int e = e0; e < RG * per_team; e += stride) {
      const int tm = e / per_team, et = e % per_team;
      const int t = et / 64, l = (et / 2) % 32, p = et % 2;
      const int row = (unit_block * RG + tm) * 8 + l / 4, token = 8 * t + 2 * (l % 4) + p;
      if (row >= m || token >= n) continue;
      const float gate = summed(tm, t, l, p), up = summed(tm, t, l, p + 2);
      const float v = gate_value(act, gate, up);
      const size_t at = size_t(token) * size_t(ldy) + size_t(row);
      y[at] = v;
      if (y_bf16) y_bf16[at] = uint16_t(bf16_bits(v));
    }
  } else {
    constexpr int per_team = TILES * 32 * 4;
    for (int e = e0; e < RG * per_team; e += stride) {
      const int tm = e / per_team, et = e % per_team;
      const int t = et / 128, l = (et / 4) % 32, i = et % 4;
      const int row = (unit_block * RG + tm) * 16 + l / 4 + 8 * (i / 2),
                token = 8 * t + 2 * (l % 4) + i % 2;
      if (row >= m || token >= n) continue;
      const size_t at = size_t(token) * size_t(ldy) + size_t(row);
      float v = summed(tm, t, l, i);
      if (times) {
        v = gate_value(act, v, times[size_t(token) * size_t(times_stride) + size_t(row)]);
        if (y_bf16) y_bf16[at] = uint16_t(bf16_bits(v));
      }
      y[at] = v;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (splits > 1) cg::this_cluster().sync();
#endif
}

// The kernel for n tokens: the fewest 8-token tiles that hold them.
template <bool GATED, int RG>
auto kernel_for(int64_t n) {
  return n <= 8    ? skinny_gemm_kernel<1, GATED, RG>
         : n <= 16 ? skinny_gemm_kernel<2, GATED, RG>
         : n <= 24 ? skinny_gemm_kernel<3, GATED, RG>
                   : skinny_gemm_kernel<4, GATED, RG>;
}

// Launches the kernel for n tokens over `units` row groups, RG a block,
// each unit's columns split over a cluster of `splits` blocks.
template <bool GATED, class... Args>
void launch_groups(int64_t n, int64_t units, int row_groups, int splits, cudaStream_t stream,
                   Args... args) {
  if (row_groups == kSkinnyRowGroups) {
    const unsigned blocks = unsigned((units + kSkinnyRowGroups - 1) / kSkinnyRowGroups);
    launch(kernel_for<GATED, kSkinnyRowGroups>(n), blocks, kWarps * 32, 0, stream, args..., 1);
  } else {
    launch_clustered(kernel_for<GATED, 1>(n), unsigned(units * splits), kWarps * 32, 0, stream,
                     dim3(unsigned(splits)), args..., splits);
  }
}

}  // namespace

namespace {

void check_row_groups(const char* who, int row_groups, int col_splits) {
  if (row_groups != 1 && row_groups != kSkinnyRowGroups)
    fail("%s: %d row groups a block (1 or %d)", who, row_groups, kSkinnyRowGroups);
  if (col_splits < 1 || col_splits > kSkinnyMaxColSplits || (col_splits > 1 && row_groups != 1))
    fail("%s: %d column splits (1 to %d, and 1 with %d row groups)", who, col_splits,
         kSkinnyMaxColSplits, kSkinnyRowGroups);
  if (col_splits > 1 && !clusters_supported())
    fail("%s: column splits need thread-block clusters (sm_90 or newer)", who);
}

}  // namespace

bool skinny_gemm_fits(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x, int64_t n) {
  return n >= 1 && n <= kSkinnyGemmMaxTokens && m >= 1 && m <= INT32_MAX && cols >= 16 &&
         cols % 16 == 0 && cols <= INT32_MAX && aligned16(w) && aligned16(x);
}

int skinny_col_splits(int64_t m, int64_t cols, bool gated, int most) {
  if (most <= 1) return 1;
  const LaunchLimits limits = current_launch_limits();
  if (limits.cc_major < 9) return 1;  // no clusters (clusters_supported)
  // Only matrices whose row groups leave a quarter of the SMs idle, split
  // into a block an SM, each warp still taking two 64-column steps.
  // Measured on the H100 (session 28, tok/s at 32 / 16 / 8 sequences,
  // splits against none): gemma-3-1b (72 units) +3.4 / +2.8 / +1.3%,
  // gemma-4-e2b (96) +2.5 / +3.1 / +2.5%; llama-3.2-1b's 128 units in 2
  // splits -0.5 / -0.7 / -2.0%; aiming at two blocks an SM (gemma-3-1b's
  // down projection in 4 splits) lost 3-5% at 16 and 32 sequences.
  const int64_t units = skinny_units(m, gated);
  if (4 * units > 3 * int64_t(limits.multiprocessors)) return 1;
  const int64_t steps = (cols + kStepCols - 1) / kStepCols;
  int s = int(std::clamp<int64_t>((limits.multiprocessors + units - 1) / units, 1,
                                  std::min(most, kSkinnyMaxColSplits)));
  while (s > 1 && steps < int64_t(s) * kWarps * 2) --s;
  return s;
}

void skinny_gemm_bf16(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x, int64_t n,
                      float* y, int64_t ldy, cudaStream_t stream, int row_groups, int col_splits) {
  if (!skinny_gemm_fits(w, m, cols, x, n))
    fail(
        "skinny_gemm_bf16: %lld tokens x %lld columns (16-byte aligned operands, columns a "
        "multiple of 16, at most %d tokens)",
        (long long)n, (long long)cols, kSkinnyGemmMaxTokens);
  if (ldy < m)
    fail("skinny_gemm_bf16: output stride %lld below %lld rows", (long long)ldy, (long long)m);
  check_row_groups("skinny_gemm_bf16", row_groups, col_splits);
  launch_groups<false>(n, skinny_units(m, false), row_groups, col_splits, stream, w, int(m),
                       int(cols), x, int(n), y, ldy, GemvGate::None,
                       static_cast<uint16_t*>(nullptr), static_cast<const float*>(nullptr),
                       int64_t(0));
}

void skinny_gemm_times_bf16(const uint16_t* w, int64_t m, int64_t cols, const uint16_t* x,
                            int64_t n, GemvGate act, const float* times, int64_t times_stride,
                            float* y, uint16_t* y_bf16, cudaStream_t stream, int row_groups,
                            int col_splits) {
  if (act == GemvGate::None || !times || times_stride < m || !skinny_gemm_fits(w, m, cols, x, n))
    fail(
        "skinny_gemm_times_bf16: %lld tokens x %lld columns, %lld rows, times stride %lld (an "
        "activation and its multiplier rows of at least the rows, 16-byte aligned operands, "
        "columns a multiple of 16, at most %d tokens)",
        (long long)n, (long long)cols, (long long)m, (long long)times_stride, kSkinnyGemmMaxTokens);
  check_row_groups("skinny_gemm_times_bf16", row_groups, col_splits);
  launch_groups<false>(n, skinny_units(m, false), row_groups, col_splits, stream, w, int(m),
                       int(cols), x, int(n), y, m, act, y_bf16, times, times_stride);
}

void skinny_gemm_gated_bf16(const uint16_t* w, int64_t F, int64_t cols, const uint16_t* x,
                            int64_t n, GemvGate act, float* y, uint16_t* y_bf16,
                            cudaStream_t stream, int row_groups, int col_splits) {
  if (act == GemvGate::None || !skinny_gemm_fits(w, 2 * F, cols, x, n))
    fail(
        "skinny_gemm_gated_bf16: %lld tokens x %lld columns, %lld gate/up pairs (an activation, "
        "16-byte aligned operands, columns a multiple of 16, at most %d tokens)",
        (long long)n, (long long)cols, (long long)F, kSkinnyGemmMaxTokens);
  check_row_groups("skinny_gemm_gated_bf16", row_groups, col_splits);
  launch_groups<true>(n, skinny_units(2 * F, true), row_groups, col_splits, stream, w, int(F),
                      int(cols), x, int(n), y, int64_t(F), act, y_bf16,
                      static_cast<const float*>(nullptr), int64_t(0));
}

}  // namespace tandem::cuda
