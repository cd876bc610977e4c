// The prefill GEMM over packed affine 4-bit weights with bf16 activations
// (W4A16, Marlin's way): the bf16 tiles' numerics — each weight rounded to
// bf16 from scale · code + bias as dequantize_affine_bf16 rounds it, times
// the bf16 activations, f32 sums — without writing and rereading the tiles.
// The alternative to gemm_affine_prefill.cu's int8 GEMM, whose every k-step
// of 32 columns costs f32 scaling of each accumulator (the activations' d
// changes every block): here the dequantization is paid once per weight a
// block and shared by the block's 64 tokens, and the mma sums in f32 itself.
//
// A block takes 128 rows x 64 tokens over all the columns: 8 warps of 16 rows
// x all 64 tokens (8 token tiles: 32 accumulators a lane). Its ring of 2
// stages holds, per 4 blocks of 32 columns, the 128 rows' StageWeights and
// the 64 tokens' 128 bf16 columns (rows padded to 320 bytes so a quarter
// warp's 16-byte loads of 8 tokens hit distinct banks), copied by cp.async.
// A warp takes its rows' codes by ldmatrix.x4 (lane (g, q): word q of rows g
// and g + 8 — the int8 GEMM's layout), dequantizes each word's 8 codes to
// bf16 in registers and runs two m16n8k16 steps per block: step 0 takes
// columns 8q + 0..3 of every lane's word as k-slots 2q, 2q + 1, 2q + 8, 2q +
// 9, step 1 columns 8q + 4..7; a lane's B is one 16-byte load of its token's
// columns 8q .. 8q + 7, which serves both.
//
// Written without a GPU (twenty-third session, no device time left): the
// decoder takes it only with TANDEM_CUDA_AFFINE_W4A16=1, for steps of more
// than 32 tokens under bf16 GEMM inputs; its test (CudaQuant.W4A16GemmMatchesTheBf16Reference) and
// the A/B against the int8 GEMM and the tiles are to run before any default.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/affine_stage.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

namespace {

using affine::kStageVecs;

constexpr int kRows = 128, kTokens = 64, kWarps = 8, kThreads = 32 * kWarps, kStages = 2;
using Weights = affine::StageWeights<kRows>;
constexpr int kXPitch = 320;  // bytes of a token's 128 columns (256) and padding
constexpr int kXAt = Weights::kBytes;
constexpr int kStageBytes = kXAt + kTokens * kXPitch;  // 32 KB
constexpr int kBlockBytes = kStages * kStageBytes;

// Two weights s · code + b rounded to bf16 as dequantize_affine_bf16 rounds
// them (the product, then the sum, each to nearest), packed low first.
__device__ __forceinline__ uint32_t dequant2(uint32_t word, int j, float s, float b) {
  // A code under the exponent of 2^23 is exactly 2^23 + code: no int-to-float
  // conversion (a quarter-rate instruction).
  const float c0 = __uint_as_float(0x4B000000u | ((word >> (4 * j)) & 15u)) - 8388608.f,
              c1 = __uint_as_float(0x4B000000u | ((word >> (4 * j + 4)) & 15u)) - 8388608.f;
  const __nv_bfloat162 v =
      __floats2bfloat162_rn(__fadd_rn(__fmul_rn(s, c0), b), __fadd_rn(__fmul_rn(s, c1), b));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x: bf16 rows [n, cols] (16-byte aligned rows: cols a multiple of 32).
// grid: (row blocks, token blocks).
__global__ void __launch_bounds__(kThreads, 1)
    affine_w4a16_kernel(affine::StageSource w, const uint16_t* x, int n, float* y) {
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch_dependents();
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int row0 = int(blockIdx.x) * kRows, tok0 = int(blockIdx.y) * kTokens;
  const int cols = w.cols, vecs = cols / 32, stages = (vecs + kStageVecs - 1) / kStageVecs;
  auto slot = [&](int i) { return smem + (i % kStages) * kStageBytes; };

  auto issue_weights = [&](int i) {
    if (i < stages) Weights::copy<kThreads>(slot(i), w, row0, kStageVecs * i, vecs, tid);
  };
  // The stage's 128 columns (fewer in a last stage, zero-filled) of tokens
  // tok0 .. tok0 + 63 (past n: zeros), 16 chunks of 16 bytes a token.
  auto issue_x = [&](int i) {
    if (i >= stages) return;
    uint8_t* st = slot(i) + kXAt;
    const int c0 = 32 * kStageVecs * i;
    for (int e = tid; e < kTokens * 16; e += kThreads) {
      const int t = e / 16, k = e % 16, col = c0 + 8 * k;
      const bool in = tok0 + t < n && col < cols;
      const uint16_t* src = in ? x + size_t(tok0 + t) * size_t(cols) + size_t(col) : x;
      cp_async16(reinterpret_cast<uint16_t*>(st + t * kXPitch + 16 * k), src, in);
    }
  };
  issue_weights(0);
  pdl_wait();
  issue_x(0);
  cp_async_commit();

  const int mat = lane / 8, mrow = lane % 8;  // ldmatrix: lane l gives row l % 8 of matrix l / 8
  const int wrow = 16 * warp;                 // this warp's rows in the block
  float acc[kTokens / 8][4] = {};
  for (int i = 0; i < stages; ++i) {
    issue_weights(i + 1);
    issue_x(i + 1);
    cp_async_commit();
    cp_async_wait<1>();  // stage i's group
    __syncthreads();
    const uint8_t* st = slot(i);
    const int vs = kStageVecs * i;
#pragma unroll
    for (int c = 0; c < kStageVecs; c += 2) {
      if (vs + c >= vecs) break;
      uint32_t a[4];  // word q of rows g, g + 8 of block c, then of block c + 1
      ldmatrix_x4(a, reinterpret_cast<const uint16_t*>(
                         st + Weights::code_at(wrow + mrow + 8 * (mat & 1), c + (mat >> 1))));
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (vs + c + k >= vecs) break;  // the slot's scales were not written
        const float s0 = Weights::scale(st, wrow + g, c + k, w.group_shift),
                    b0 = Weights::bias(st, wrow + g, c + k, w.group_shift),
                    s1 = Weights::scale(st, wrow + g + 8, c + k, w.group_shift),
                    b1 = Weights::bias(st, wrow + g + 8, c + k, w.group_shift);
        const uint32_t lo = a[2 * k], hi = a[2 * k + 1];  // rows g and g + 8
        // Step 0: codes 0-3 of the lane's word; step 1: codes 4-7.
        const uint32_t a0[4] = {dequant2(lo, 0, s0, b0), dequant2(hi, 0, s1, b1),
                                dequant2(lo, 2, s0, b0), dequant2(hi, 2, s1, b1)};
        const uint32_t a1[4] = {dequant2(lo, 4, s0, b0), dequant2(hi, 4, s1, b1),
                                dequant2(lo, 6, s0, b0), dequant2(hi, 6, s1, b1)};
        const uint8_t* xs = st + kXAt + ((c + k) * 32 + 8 * q) * 2;
#pragma unroll
        for (int t = 0; t < kTokens / 8; ++t) {
          const uint4 b = *reinterpret_cast<const uint4*>(xs + (8 * t + g) * kXPitch);
          mma(acc[t], a0, b.x, b.y);
          mma(acc[t], a1, b.z, b.w);
        }
      }
    }
    __syncthreads();  // stage i is read before the next iteration refills its slot
  }
  cp_async_wait<0>();
  // C slots: e = 0, 1 row g at tokens 2q, 2q + 1 of the tile; 2, 3 row g + 8.
#pragma unroll
  for (int t = 0; t < kTokens / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + wrow + g + 8 * (e / 2), token = tok0 + 8 * t + 2 * q + e % 2;
      if (row < w.rows && token < n) y[size_t(token) * size_t(w.rows) + size_t(row)] = acc[t][e];
    }
}

}  // namespace

void gemm_affine_w4a16(const AffineMatrix& w, const uint16_t* x_bf16, int64_t n, float* y,
                       cudaStream_t stream) {
  if (w.rows <= 0 || n <= 0) return;
  affine::check(w, "gemm_affine_w4a16");
  if (w.bits != 4 || w.rows > INT32_MAX || w.cols > INT32_MAX || n > int64_t(65535) * kTokens ||
      reinterpret_cast<uintptr_t>(x_bf16) % 16 != 0)
    fail(
        "gemm_affine_w4a16: %d-bit weights of %lld x %lld over %lld tokens (4 bits, activations "
        "16-byte aligned)",
        w.bits, (long long)w.rows, (long long)w.cols, (long long)n);
  allow_opt_in_shared_memory(reinterpret_cast<const void*>(affine_w4a16_kernel));
  const dim3 grid(unsigned((w.rows + kRows - 1) / kRows), unsigned((n + kTokens - 1) / kTokens));
  launch(affine_w4a16_kernel, grid, kThreads, size_t(kBlockBytes), stream, affine::stage_source(w),
         x_bf16, int(n), y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
