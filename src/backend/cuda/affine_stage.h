// The pieces of the int8 tensor-core GEMM over packed affine 4-bit weights
// (gemm_affine_mma.cu, decode steps of up to 32 tokens): the int8 mma, its
// integer sums as floats, and a stage of
// weights in shared memory — ROWS rows' codes, scales and biases over 4
// blocks of 32 columns, copied by cp.async. Included only by .cu files.
#pragma once

#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda::affine {

constexpr int kStageVecs = 4;  // blocks of 32 columns a stage: 64 bytes of a row's codes

// c = a · b over one k-step of 32: A the codes of rows g and g + 8 (lane g =
// lane / 4), B one token's int8 activations, s32 accumulation from zero.
__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  c[0] = c[1] = c[2] = c[3] = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A word of a row's codes as the mma's k-slots: its even nibbles (columns
// 0, 2, 4, 6) then its odd ones, the order quantize_acts_kernel lays the
// activations in; lo and hi are rows g and g + 8.
__device__ __forceinline__ void mma_codes(int (&c)[4], uint32_t lo, uint32_t hi, uint2 b) {
  mma_s8(c, lo & 0x0F0F0F0Fu, hi & 0x0F0F0F0Fu, (lo >> 4) & 0x0F0F0F0Fu, (hi >> 4) & 0x0F0F0F0Fu,
         b.x, b.y);
}

// An integer sum as a float without the quarter-rate conversion: |c| <
// 2^22 (32 products of at most 15 · 127 are), added under the exponent of
// 1.5 · 2^23.
__device__ __forceinline__ float small_int_float(int c) {
  return __int_as_float(c + 0x4B400000) - 12582912.f;
}

// acc[e] += s[row] · d[token] · c[e] + b[row] · (d · Σq)[token] for the C
// fragment's elements: e = 0, 1 row g at tokens 2q, 2q + 1; 2, 3 row g + 8.
// m: (d, d · Σq) of tokens 2q and 2q + 1.
__device__ __forceinline__ void accumulate(float (&acc)[4], const int (&c)[4], const float (&s)[2],
                                           const float (&b)[2], float4 m) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int h = e / 2;
    const float d = e % 2 ? m.z : m.x, dq = e % 2 ? m.w : m.y;
    acc[e] = fmaf(small_int_float(c[e]), s[h] * d, fmaf(b[h], dq, acc[e]));
  }
}

// A 4-bit matrix as the GEMM kernels read it (their weight parameter):
// codes, scales and biases (MLX layout), its shape, log2 of its group, and
// scale_bytes, the bytes of a row's scales a stage copies at once — all 128 /
// group of them (16, 8 or 4) where every row's are so aligned, else 4 (a
// float at a time). Made on the host by stage_source().
struct StageSource {
  const uint32_t* codes;
  const float* scales;
  const float* biases;
  int rows, cols, group_shift, scale_bytes;
};

// A stage of ROWS rows' weights: codes (64 bytes a row, its 16-byte blocks
// swizzled so ldmatrix's 8 rows fall on distinct banks), then the scales
// and then the biases of the stage's 1-4 groups (4 floats a row each).
template <int ROWS>
struct StageWeights {
  static constexpr int kScalesAt = ROWS * 64, kBiasesAt = ROWS * 80, kBytes = ROWS * 96;
  // The byte of row r's block c of codes.
  __device__ static int code_at(int r, int c) { return r * 64 + ((c ^ ((r >> 1) & 3)) << 4); }

  // Copies (cp.async, no commit) the stage of blocks vs .. vs + 3 (those
  // below v1; the rest of the codes zero-filled) of rows row0 .. row0 +
  // ROWS - 1 (past the matrix: its last row, never stored) of `w` by THREADS
  // threads, this one `tid`.
  template <int THREADS>
  __device__ static void copy(uint8_t* st, const StageSource& w, int row0, int vs, int v1,
                              int tid) {
    const int words = w.cols / 8, groups = w.cols >> w.group_shift;
    const int stage_groups = (kStageVecs * 32) >> w.group_shift;  // 1, 2 or 4
#pragma unroll
    for (int e = tid; e < ROWS * kStageVecs; e += THREADS) {
      const int r = e / kStageVecs, c = e % kStageVecs;
      const size_t row = size_t(min(row0 + r, w.rows - 1));
      cp_async16(reinterpret_cast<uint16_t*>(st + code_at(r, c)),
                 w.codes + row * size_t(words) + size_t(vs + c) * 4, vs + c < v1);
    }
    const int g0 = (vs * 32) >> w.group_shift;  // vs is a multiple of 4: groups start here
    float* ss = reinterpret_cast<float*>(st + kScalesAt);
    float* sb = reinterpret_cast<float*>(st + kBiasesAt);
    if (w.scale_bytes == 4) {
      for (int e = tid; e < ROWS * stage_groups; e += THREADS) {
        const int r = e / stage_groups, j = e % stage_groups;
        if (g0 + j >= groups) continue;
        const size_t at = size_t(min(row0 + r, w.rows - 1)) * size_t(groups) + size_t(g0 + j);
        cp_async_small<4>(ss + r * 4 + j, w.scales + at);
        cp_async_small<4>(sb + r * 4 + j, w.biases + at);
      }
      return;
    }
    for (int r = tid; r < ROWS; r += THREADS) {
      const size_t at = size_t(min(row0 + r, w.rows - 1)) * size_t(groups) + size_t(g0);
      if (w.scale_bytes == 16) {
        cp_async_small<16>(ss + r * 4, w.scales + at);
        cp_async_small<16>(sb + r * 4, w.biases + at);
      } else {
        cp_async_small<8>(ss + r * 4, w.scales + at);
        cp_async_small<8>(sb + r * 4, w.biases + at);
      }
    }
  }

  // Row r's scale and bias of the stage's block c (so of group
  // (32 c) >> group_shift of the stage).
  __device__ static float scale(const uint8_t* st, int r, int c, int group_shift) {
    return reinterpret_cast<const float*>(st + kScalesAt)[r * 4 + ((c * 32) >> group_shift)];
  }
  __device__ static float bias(const uint8_t* st, int r, int c, int group_shift) {
    return reinterpret_cast<const float*>(st + kBiasesAt)[r * 4 + ((c * 32) >> group_shift)];
  }
};

// The ring of S stages the int8 GEMM streams through (gemm_affine_mma.cu).
// Its prologue: the weights of stages 0 .. S - 2,
// a commit group each, go out before the PDL wait (weights are never
// written), their activations after it, a group each.
template <int S, typename IssueWeights, typename IssueActs>
__device__ __forceinline__ void ring_prologue(IssueWeights&& issue_weights,
                                              IssueActs&& issue_acts) {
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    issue_weights(i);
    cp_async_commit();
  }
  pdl_wait();
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    issue_acts(i);
    cp_async_commit();
  }
}

// Before stage i is read: stage i + S - 1 goes out as one group (empty past
// the last stage, so the count holds), then the wait until at most S - 1
// groups are pending — the prologue's and one a stage since, so stage i's
// weights and activations have landed. The caller then synchronizes the
// threads sharing the ring, so that every thread's copies are visible.
template <int S, typename IssueWeights, typename IssueActs>
__device__ __forceinline__ void ring_next(int i, IssueWeights&& issue_weights,
                                          IssueActs&& issue_acts) {
  issue_weights(i + S - 1);
  issue_acts(i + S - 1);
  cp_async_commit();
  cp_async_wait<S - 1>();
}

// `w` as the GEMM kernels take it (a 4-bit AffineMatrix the caller has
// checked: rows and columns fit an int).
inline StageSource stage_source(const AffineMatrix& w) {
  const int stage_groups = int(kStageVecs * 32 / w.group);
  const bool aligned = (w.cols / w.group) % stage_groups == 0 &&
                       reinterpret_cast<uintptr_t>(w.scales) % (4 * stage_groups) == 0 &&
                       reinterpret_cast<uintptr_t>(w.biases) % (4 * stage_groups) == 0;
  return {w.data,
          w.scales,
          w.biases,
          int(w.rows),
          int(w.cols),
          log2_exact(int(w.group)),
          aligned ? 4 * stage_groups : 4};
}

}  // namespace tandem::cuda::affine
