// The int8 tensor-core GEMM of steps longer than kAffineMmaMaxTokens (prefill)
// over packed affine 4-bit weights: gemm_affine_mma.cu's numerics, operand
// layouts and stages of weights (affine_stage.h), tiled for many tokens,
// where the other way dequantizes bf16 tiles of every matrix for cuBLAS at
// every chunk (24-64% slower prefill than bf16 weights on the H100,
// bench/results/cuda-session23-2026-12-05.md).
//
// A block takes 64 rows x 64 tokens over all the columns; its 8 warps are 2
// row halves x 4 token quarters, each 2 row tiles x 2 token tiles (32 rows x
// 16 tokens: 16 accumulators a lane), so no warp's columns are split and
// each writes its sums straight to y. The block's ring of kStages stages (4
// blocks of 32 columns each) holds the 64 rows' StageWeights and the 64
// tokens' activations and (d, d · Σq) — MmaActs keeps a block's tokens
// contiguous, so each is one span — copied by all 256 threads with cp.async;
// the weights of the first stages go out before the PDL wait. Every warp
// takes A by ldmatrix.x4 (two k-steps) for each of its row tiles and reuses
// it across its token tiles.
//
// Written without a GPU (twenty-third session, no device time left): opt-in
// (TANDEM_CUDA_AFFINE_MMA_PREFILL=1 for the decoder), its kernel test and
// the A/B against bf16 tiles to run before it becomes a default.
#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/affine_stage.h"
#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

using affine::kStageVecs;
using affine::MmaActs;

constexpr int kRows = 64, kTokens = 64, kThreads = 256, kStages = 3;
using Weights = affine::StageWeights<kRows>;
// A stage: the weights, then block c's 64 tokens' operands (32 bytes each)
// at kActsAt + 2048 c, then their (d, d · Σq) at kMetaAt + 512 c.
constexpr int kActsAt = Weights::kBytes;
constexpr int kMetaAt = kActsAt + kStageVecs * kTokens * 32;
constexpr int kStageBytes = kMetaAt + kStageVecs * kTokens * 8;  // 16 KB
constexpr int kBlockBytes = kStages * kStageBytes;               // 48 KB: no opt-in

// acts: MmaActs of `tokens` (a multiple of kTokens; rows n .. tokens - 1
// zeros), written by the kernel before. grid: (row blocks, tokens / 64).
__global__ void __launch_bounds__(kThreads, 2)
    affine_prefill_kernel(affine::StageSource w, const uint8_t* acts, int tokens, int n, float* y) {
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch_dependents();
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int row_half = warp / 4, token_quarter = warp % 4;
  const int row0 = int(blockIdx.x) * kRows, tok0 = int(blockIdx.y) * kTokens;
  const int cols = w.cols, vecs = cols / 32, stages = (vecs + kStageVecs - 1) / kStageVecs;
  const uint8_t* meta = acts + MmaActs::meta_at(cols, tokens);
  auto slot = [&](int i) { return smem + (i % kStages) * kStageBytes; };

  // Stage i's weights, then its activations (blocks past the row: zeros),
  // each ending a commit group, empty past the last stage so the waits below
  // count the same.
  auto issue_weights = [&](int i) {
    if (i < stages) Weights::copy<kThreads>(slot(i), w, row0, kStageVecs * i, vecs, tid);
  };
  auto issue_acts = [&](int i) {
    if (i >= stages) return;
    uint8_t* st = slot(i);
    const int vs = kStageVecs * i;
    for (int e = tid; e < kStageVecs * kTokens * 2; e += kThreads) {
      const int c = e / (kTokens * 2), k = e % (kTokens * 2);
      const bool in = vs + c < vecs;
      const uint8_t* src = acts + (size_t(vs + c) * size_t(tokens) + size_t(tok0)) * 32 + 16 * k;
      cp_async16(reinterpret_cast<uint16_t*>(st + kActsAt + c * kTokens * 32 + 16 * k),
                 in ? src : acts, in);
    }
    for (int e = tid; e < kStageVecs * kTokens / 2; e += kThreads) {
      const int c = e / (kTokens / 2), k = e % (kTokens / 2);
      const bool in = vs + c < vecs;
      const uint8_t* src = meta + (size_t(vs + c) * size_t(tokens) + size_t(tok0)) * 8 + 16 * k;
      cp_async16(reinterpret_cast<uint16_t*>(st + kMetaAt + c * kTokens * 8 + 16 * k),
                 in ? src : meta, in);
    }
  };
  affine::ring_prologue<kStages>(issue_weights, issue_acts);

  const int mat = lane / 8, mrow = lane % 8;  // ldmatrix: lane l gives row l % 8 of matrix l / 8
  const int wrow = 32 * row_half, wtok = 16 * token_quarter;  // this warp's rows and tokens
  float acc[2][2][4] = {};
  for (int i = 0; i < stages; ++i) {
    affine::ring_next<kStages>(i, issue_weights, issue_acts);
    __syncthreads();  // the ring is the block's
    const uint8_t* st = slot(i);
    const int vs = kStageVecs * i;
#pragma unroll
    for (int c = 0; c < kStageVecs; c += 2) {
      if (vs + c >= vecs) break;
      // Each row tile's A for blocks c and c + 1: rows +0..7 and +8..15 of
      // block c, then of c + 1.
      uint32_t a[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
        ldmatrix_x4(
            a[r], reinterpret_cast<const uint16_t*>(
                      st + Weights::code_at(wrow + 16 * r + mrow + 8 * (mat & 1), c + (mat >> 1))));
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (vs + c + k >= vecs) break;  // the slot's scales were not written
        // Token tile t's operand (token 8t + g of the warp's) and (d, d · Σq)
        // of its tokens 2q and 2q + 1.
        uint2 b[2];
        float4 m[2];
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int tok = wtok + 8 * t;
          b[t] = *reinterpret_cast<const uint2*>(st + kActsAt + (c + k) * kTokens * 32 +
                                                 (tok + g) * 32 + 8 * q);
          m[t] = *reinterpret_cast<const float4*>(st + kMetaAt + (c + k) * kTokens * 8 +
                                                  (tok + 2 * q) * 8);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float s[2], bias[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            s[h] = Weights::scale(st, wrow + 16 * r + g + 8 * h, c + k, w.group_shift);
            bias[h] = Weights::bias(st, wrow + 16 * r + g + 8 * h, c + k, w.group_shift);
          }
#pragma unroll
          for (int t = 0; t < 2; ++t) {
            int cc[4];
            affine::mma_codes(cc, a[r][2 * k], a[r][2 * k + 1], b[t]);
            affine::accumulate(acc[r][t], cc, s, bias, m[t]);
          }
        }
      }
    }
    __syncthreads();  // stage i is read before a later issue refills its slot
  }
  cp_async_wait<0>();
  // C slots: e = 0, 1 row g at tokens 2q, 2q + 1 of the tile; 2, 3 row g + 8.
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + wrow + 16 * r + g + 8 * (e / 2);
        const int token = tok0 + wtok + 8 * t + 2 * q + e % 2;
        if (row < w.rows && token < n)
          y[size_t(token) * size_t(w.rows) + size_t(row)] = acc[r][t][e];
      }
}

}  // namespace

int affine_prefill_tokens(int64_t n) {
  return int((n + kTokens - 1) / kTokens * kTokens);
}

void launch_affine_prefill(const AffineMatrix& w, const uint8_t* acts, int64_t n, float* y,
                           cudaStream_t stream) {
  const int tokens = affine_prefill_tokens(n);
  const dim3 grid(unsigned((w.rows + kRows - 1) / kRows), unsigned(tokens / kTokens));
  launch(affine_prefill_kernel, grid, kThreads, size_t(kBlockBytes), stream,
         affine::stage_source(w), acts, tokens, int(n), y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
