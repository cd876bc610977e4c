// The decode GEMM of up to 32 tokens over packed affine 4-bit weights on
// int8 tensor cores (mma m16n8k32, s8 × s8 → s32), the batched counterpart
// of the packed GEMV (gemv_affine.cu) with the same numerics: the
// activations quantized to int8 in blocks of 32 by quantize_acts_kernel
// (layout MmaActs), each block's integer sums scaled by the weights' group
// scale s and the activations' d, plus the group bias b times d · Σ q:
//   y[t, r] = Σ_blocks s · d · Σ code · q  +  b · d · Σ q
// The other way past the GEMV, bf16 tiles of the dequantized weights for
// the bf16 GEMM, writes and rereads 2 bytes a weight for 0.56 read here.
//
// Fragments. A block of 32 columns is one k-step of the mma. Lane (g, q)
// (g = lane / 4, q = lane % 4) holds for A the codes of rows g and g + 8 at
// k = 4q..4q+3 and 16+4q..16+4q+3; the dot product does not care which
// column a k-slot stands for, as long as A and B agree, so k = 4q.. are word
// q's even nibbles (columns 8q + 0, 2, 4, 6) and 16+4q.. its odd ones — a
// word masked (and shifted) once, no unpacking. B's lane (g, q) holds token
// g's activations at the same k-slots: the 8 bytes quantize_acts_kernel
// lays out for word q (MmaActs). C's lane holds rows g, g + 8 at tokens 2q,
// 2q + 1 of the tile.
//
// Loads. A block of 32 columns of 16 rows is 16 bytes a row, and each lane
// wants one word of two rows: loaded straight from global memory (the
// first version), a warp's 4-byte loads touched 8 cache lines each and its
// scales 16, so the kernel was bound by L1 wavefronts (ncu: L1 at 78%, DRAM
// at 10%, llama-3.2-1b's gate/up at 0.6 TB/s). Each warp now streams what
// its stages need through its own ring of shared-memory stages by cp.async:
// its rows' codes (64 contiguous bytes a row a stage), scales and biases —
// prefetched before the PDL wait, as no kernel before writes them — and
// up to 16 tokens the stage's activations (MmaActs: one contiguous span;
// see Ring for 17-32), and takes A two
// k-steps at a time with one ldmatrix.x4 (an 8x8 b16 matrix is 8 rows of
// 16 bytes: lane (g, q) gets word q of row g — A's layout). With the
// activations loaded from global memory a k-step pair at a time instead,
// each pair waited on L2 (ncu: 2-3 warps a scheduler, 0.3-0.6 eligible).
//
// A warp takes R tiles of 16 rows (the activations it loads serve all R)
// over its share of the columns, in stages of 4 blocks; a block's 8 warps
// split the columns and sum their partial tiles in shared memory at the
// end. The 4-bit codes (0..15) are valid s8 operands.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/affine_stage.h"
#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

namespace {

using affine::kStageVecs;
using affine::MmaActs;

constexpr int kWarps = 8;

// A warp's ring of stages for R row tiles and `tokens` activation rows
// (MmaActs). A stage: the 16 · R rows' StageWeights and, up to 16 tokens
// (kStagedActs), the activations of its 4 blocks (32 bytes a token a block)
// and their (d, d · Σ q). At 17-32 tokens those would take the ring to 128
// KB a block, one block an SM: measured on the H100 at 32 sequences, 5-13%
// slower than loading them from global memory a k-step pair at a time
// (llama-3.2-1b q4 15,441 → 14,694 tok/s), where at 16 the ring gains 4-10%.
template <int TILES, int R>
struct Ring {
  using Weights = affine::StageWeights<16 * R>;
  static constexpr bool kStagedActs = TILES <= 2;
  static constexpr int kStages = R == 1 ? (kStagedActs ? 3 : 4) : 2;
  static constexpr int kActsAt = Weights::kBytes;
  __host__ __device__ static int meta_at(int tokens) { return kActsAt + 128 * tokens; }
  __host__ __device__ static int stage_bytes(int tokens) {
    return kStagedActs ? meta_at(tokens) + 32 * tokens : kActsAt;
  }
  __host__ __device__ static int block_bytes(int tokens) {
    return kWarps * kStages * stage_bytes(tokens);
  }
};

// TILES: 8-token mma tiles the kernel is built for (tokens 8t + g; the
// acts hold `tokens` = 8 · tiles ≤ 8 · TILES rows, MmaActs). R: 16-row tiles
// a warp takes. acts: written by the kernel before (read only after the PDL
// wait, by cp.async: coherent, launch.h). Ring<TILES, R>::block_bytes(tokens)
// of dynamic shared memory.
template <int TILES, int R>
__global__ void __launch_bounds__(kWarps * 32, 2)
    affine_mma_kernel(affine::StageSource w, const uint8_t* acts, int tokens, int n, float* y) {
  using Rg = Ring<TILES, R>;
  constexpr int S = Rg::kStages;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch_dependents();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, q = lane % 4;
  const int cols = w.cols, vecs = cols / 32, tiles = tokens / 8;
  // This warp's blocks of 32 columns, whole stages of them (so a stage's
  // groups start at its first block).
  const int per = ((vecs + kWarps - 1) / kWarps + kStageVecs - 1) / kStageVecs * kStageVecs;
  const int v0 = min(warp * per, vecs), v1 = min(v0 + per, vecs);
  const int stages = (v1 - v0 + kStageVecs - 1) / kStageVecs;
  const int row0 = int(blockIdx.x) * 16 * R;
  const int stage_bytes = Rg::stage_bytes(tokens), meta_at = Rg::meta_at(tokens);
  uint8_t* ring = smem + size_t(warp) * S * size_t(stage_bytes);
  auto slot = [&](int i) { return ring + (i % S) * stage_bytes; };

  // Stage i's codes, scales and biases (rows past the matrix read its last
  // row, never stored), then its activations: each ends a commit group,
  // empty past the last stage so the waits below count the same.
  auto issue_weights = [&](int i) {
    if (i < stages) Rg::Weights::template copy<32>(slot(i), w, row0, v0 + kStageVecs * i, v1, lane);
  };
  const uint8_t* meta = acts + MmaActs::meta_at(cols, tokens);
  auto issue_acts = [&](int i) {
    if (!Rg::kStagedActs || i >= stages) return;
    uint8_t* st = slot(i);
    const int vs = v0 + kStageVecs * i, nv = min(kStageVecs, v1 - vs);
    // The stage's blocks are one span of 32 · tokens bytes each, and of
    // 8 · tokens bytes of (d, d · Σ q) each (16-byte chunks: tokens is a
    // multiple of 8).
    for (int e = lane; e < 2 * tokens * kStageVecs; e += 32)
      cp_async16(reinterpret_cast<uint16_t*>(st + Rg::kActsAt + 16 * e),
                 acts + size_t(vs) * size_t(tokens) * 32 + size_t(16 * e), e < 2 * tokens * nv);
    for (int e = lane; e < tokens * kStageVecs / 2; e += 32)
      cp_async16(reinterpret_cast<uint16_t*>(st + meta_at + 16 * e),
                 meta + size_t(vs) * size_t(tokens) * 8 + size_t(16 * e), e < tokens * nv / 2);
  };
  affine::ring_prologue<S>(issue_weights, issue_acts);

  const int mat = lane / 8, mrow = lane % 8;  // ldmatrix: lane l gives row l % 8 of matrix l / 8
  float acc[R][TILES][4] = {};
  for (int i = 0; i < stages; ++i) {
    affine::ring_next<S>(i, issue_weights, issue_acts);
    __syncwarp();  // the ring is this warp's
    const uint8_t* st = slot(i);
    const int vs = v0 + kStageVecs * i;
#pragma unroll
    for (int c = 0; c < kStageVecs; c += 2) {
      if (vs + c >= v1) break;
      // Unstaged, the pair's activations are loaded here, all before the
      // first mma: token 8t + g's operand, and (d, d · Σq) of tokens
      // 8t + 2q and 8t + 2q + 1 (the C fragment's columns).
      uint2 b_pair[2][TILES];
      float4 m_pair[2][TILES];
      if constexpr (!Rg::kStagedActs) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const size_t at = size_t(vs + c + k) * size_t(tokens);
#pragma unroll
          for (int t = 0; t < TILES; ++t) {
            const bool live = vs + c + k < v1 && t < tiles;
            b_pair[k][t] =
                live ? *reinterpret_cast<const uint2*>(acts + (at + 8 * t + g) * 32 + 8 * q)
                     : make_uint2(0, 0);
            m_pair[k][t] = live ? *reinterpret_cast<const float4*>(meta + (at + 8 * t + 2 * q) * 8)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Matrices: rows 16r..+7 and 16r+8..+15 of block c, then of c + 1.
        uint32_t a[4];
        ldmatrix_x4(a,
                    reinterpret_cast<const uint16_t*>(
                        st + Rg::Weights::code_at(16 * r + mrow + 8 * (mat & 1), c + (mat >> 1))));
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          // Past the share: the slot's scales may never have been written.
          if (vs + c + k >= v1) break;
          float s[2], bias[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            s[h] = Rg::Weights::scale(st, 16 * r + g + 8 * h, c + k, w.group_shift);
            bias[h] = Rg::Weights::bias(st, 16 * r + g + 8 * h, c + k, w.group_shift);
          }
          const uint32_t lo = a[2 * k], hi = a[2 * k + 1];  // rows g and g + 8
          const uint8_t* blk = st + Rg::kActsAt + (c + k) * tokens * 32;
          const uint8_t* blk_meta = st + meta_at + (c + k) * tokens * 8;
#pragma unroll
          for (int t = 0; t < TILES; ++t) {
            if (t >= tiles) break;
            uint2 b;
            float4 mt;
            if constexpr (Rg::kStagedActs) {  // the same operands, from the stage
              b = *reinterpret_cast<const uint2*>(blk + (8 * t + g) * 32 + 8 * q);
              mt = *reinterpret_cast<const float4*>(blk_meta + (8 * t + 2 * q) * 8);
            } else {
              b = b_pair[k][t];
              mt = m_pair[k][t];
            }
            int cc[4];
            affine::mma_codes(cc, lo, hi, b);
            affine::accumulate(acc[r][t], cc, s, bias, mt);
          }
        }
      }
    }
    __syncwarp();  // the slot is read before a later issue refills it
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with its ring: the partial sums take it over
  // One row tile at a time. Element e: token tile, lane and C slot; c0, c1
  // are row g at tokens 2q, 2q + 1, c2, c3 row g + 8.
  float(*partial)[TILES][32][4] = reinterpret_cast<float(*)[TILES][32][4]>(smem);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][t][lane][e] = acc[r][t][e];
    __syncthreads();
    for (int e = int(threadIdx.x); e < TILES * 128; e += kWarps * 32) {
      const int t = e / 128, l = (e / 4) % 32, i = e % 4;
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) sum += partial[k][t][l][i];
      const int out_row = row0 + 16 * r + l / 4 + 8 * (i / 2), token = 8 * t + 2 * (l % 4) + i % 2;
      if (out_row < w.rows && token < n) y[size_t(token) * size_t(w.rows) + size_t(out_row)] = sum;
    }
  }
}

// The most rows (16-row tiles) a warp of TILES-tile blocks takes over `w`
// while the grid still gives every SM a block and the ring of `tokens`
// fits the device's shared memory: up to 2, or up to
// TANDEM_CUDA_AFFINE_MMA_ROW_TILES (1, 2 or 4, for measuring: more tiles a
// warp share its activation loads, fewer give the SMs more blocks; at 16
// tokens 4 took 139 KB a block and lost 7-11% on the H100; 17-32 tokens
// take at most 2: 4 spilled 584 bytes a thread). 0: not even one fits.
template <int TILES>
int row_tiles(const AffineMatrix& w, int tokens) {
  static const int64_t asked = env_count("TANDEM_CUDA_AFFINE_MMA_ROW_TILES", 0);
  const int64_t cap = asked > 0 ? asked : 2;
  const LaunchLimits limits = current_launch_limits();
  const int64_t sms = std::max(1, limits.multiprocessors);
  auto fits = [&](int bytes) {
    return size_t(bytes) <= std::max<size_t>(limits.smem_optin, 48 << 10);
  };
  auto blocks = [&](int r) { return (w.rows + 16 * r - 1) / (16 * r); };
  if constexpr (TILES <= 2) {
    if (cap >= 4 && blocks(4) >= sms && fits(Ring<TILES, 4>::block_bytes(tokens))) return 4;
  }
  if (cap >= 2 && blocks(2) >= sms && fits(Ring<TILES, 2>::block_bytes(tokens))) return 2;
  return fits(Ring<TILES, 1>::block_bytes(tokens)) ? 1 : 0;
}

template <int TILES>
void launch_tiles(const AffineMatrix& w, const uint8_t* acts, int64_t n, float* y,
                  cudaStream_t stream) {
  const int tokens = MmaActs::tokens(int(n)), r = row_tiles<TILES>(w, tokens);
  if (r == 0)
    fail("gemm_affine_int8: %lld tokens do not fit this device's shared memory", (long long)n);
  const affine::StageSource src = affine::stage_source(w);
  auto go = [&](auto kernel, int rr, int bytes) {
    if (bytes > 48 * 1024) allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
    launch(kernel, unsigned((w.rows + 16 * rr - 1) / (16 * rr)), kWarps * 32, size_t(bytes), stream,
           src, acts, tokens, int(n), y);
  };
  if constexpr (TILES <= 2) {
    if (r == 4) return go(affine_mma_kernel<TILES, 4>, 4, Ring<TILES, 4>::block_bytes(tokens));
  }
  if (r == 2)
    go(affine_mma_kernel<TILES, 2>, 2, Ring<TILES, 2>::block_bytes(tokens));
  else
    go(affine_mma_kernel<TILES, 1>, 1, Ring<TILES, 1>::block_bytes(tokens));
}

}  // namespace

bool affine_mma_takes(const AffineMatrix& w, int64_t n) {
  if (w.bits != 4 || n < 1 || n > kAffineMmaMaxTokens || w.rows > INT32_MAX || w.cols > INT32_MAX)
    return false;
  const int tokens = MmaActs::tokens(int(n));
  return (n <= 16 ? row_tiles<2>(w, tokens) : row_tiles<4>(w, tokens)) > 0;
}

void launch_affine_mma(const AffineMatrix& w, const uint8_t* acts, int64_t n, float* y,
                       cudaStream_t stream) {
  if (n <= 16)
    launch_tiles<2>(w, acts, n, y, stream);
  else
    launch_tiles<4>(w, acts, n, y, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
