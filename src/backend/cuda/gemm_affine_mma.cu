// The decode GEMM of up to 32 tokens over packed affine 4-bit weights on
// int8 tensor cores (mma m16n8k32, s8 × s8 → s32), the batched counterpart
// of the packed GEMV (gemv_affine.cu) with the same numerics: the
// activations quantized to int8 in blocks of 32 by quantize_acts_kernel
// (layout Acts<4>), each block's integer sums scaled by the weights' group
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
// g's activations at the same k-slots: exactly the 8 bytes quantize_acts_kernel
// lays out for word q (even columns, then odd). C's lane holds rows g, g + 8
// at tokens 2q, 2q + 1 of the tile.
//
// A warp takes R tiles of 16 rows (the activations it loads serve all R)
// over its share of the columns; a block's 8 warps split the columns and
// sum their partial tiles in shared memory at the end. The 4-bit codes
// (0..15) are valid s8 operands.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  c[0] = c[1] = c[2] = c[3] = 0;
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An integer sum as a float without the quarter-rate conversion: |c| <
// 2^22 (32 products of at most 15 · 127 are), added under the exponent of
// 1.5 · 2^23.
__device__ __forceinline__ float small_int_float(int c) {
  return __int_as_float(c + 0x4B400000) - 12582912.f;
}

// TILES: 8-token mma tiles (tokens 8t + g), n ≤ 8 · TILES. R: 16-row tiles
// a warp takes. acts: n rows of act_bytes (Acts<4>), written by the kernel
// before (plain loads: launch.h). Two blocks an SM (at most 128 registers).
// PF: the rows' group scales and biases are loaded a round ahead with the
// codes (TANDEM_CUDA_AFFINE_MMA_PREFETCH=1; opt-in, written without a GPU:
// loaded with the round's activations, a round whose blocks start a new
// group waits on their DRAM latency, not the activations' L2 one).
template <int TILES, int R, bool PF>
__global__ void __launch_bounds__(kWarps * 32, 2)
    affine_mma_kernel(const uint32_t* __restrict__ W, const float* __restrict__ scales,
                      const float* __restrict__ biases, int group_shift, int rows, int cols,
                      const uint8_t* acts, int act_bytes, int n, float* y) {
  using A = affine::Acts<4>;
  __shared__ float partial[kWarps][TILES][32][4];
  pdl_launch_dependents();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, q = lane % 4;
  const int vecs = A::vecs(cols), words = cols / 8, groups = cols >> group_shift;
  const int per = (vecs + kWarps - 1) / kWarps;
  const int v0 = min(warp * per, vecs), v1 = min(v0 + per, vecs);  // this warp's blocks of 32
  // Rows past the matrix read its last row (never stored).
  int row[R][2];
  const uint32_t* w[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[r][h] = min(int(blockIdx.x) * 16 * R + 16 * r + g + 8 * h, rows - 1);
      w[r][h] = W + size_t(row[r][h]) * size_t(words) + q;  // word 4v + q of block v
    }
  // Word q of block v in token t's row: plane q / 2, 8 bytes at (q % 2) · 8.
  const int act_at = (q / 2) * 16 * vecs + (q % 2) * 8;
  const size_t meta_at = A::meta_at(cols);

  // Blocks of 32 columns a round: codes in flight, and the round's
  // activations loaded together (more spilled registers at 128).
  constexpr int D = (TILES > 2 ? 2 : 4) / R > 0 ? (TILES > 2 ? 2 : 4) / R : 1;
  // What a round loads a round ahead: the codes and, with PF, the group
  // scales and biases (without PF the round loads those itself).
  struct Ahead {
    uint32_t code[D][R][2];
    float s[D][R][2], bias[D][R][2];
  };
  Ahead ahead{};
  // The group scale and bias of row tile r's row h at block vd (in: vd is
  // in the warp's share; else group 0, unused).
  auto load_affine = [&](int vd, bool in, int r, int h, float& s_out, float& b_out) {
    const int grp = in ? (vd * 32) >> group_shift : 0;
    s_out = __ldg(scales + size_t(row[r][h]) * groups + grp);
    b_out = __ldg(biases + size_t(row[r][h]) * groups + grp);
  };
  auto load_codes = [&](int v) {
#pragma unroll
    for (int d = 0; d < D; ++d)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool in = v + d < v1;
          ahead.code[d][r][h] = in ? __ldg(w[r][h] + 4 * (v + d)) : 0u;
          if constexpr (PF) load_affine(v + d, in, r, h, ahead.s[d][r][h], ahead.bias[d][r][h]);
        }
  };
  load_codes(v0);
  pdl_wait();
  float acc[R][TILES][4] = {};
  for (int v = v0; v < v1; v += D) {
    Ahead now = ahead;
    if (v + D < v1) load_codes(v + D);
    // Every load of the round goes out before its first mma: token 8t + g's
    // operand and the (d, d · Σq) of tokens 8t + 2q and 8t + 2q + 1 (the C
    // fragment's columns) of each block (zeros past n and past the share),
    // and the rows' group scales and biases (the first version loaded them
    // block by block, each block's mmas waiting on its own loads).
    uint2 b[D][TILES];
    float2 m[D][TILES][2];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int vd = v + d;
      const bool in = vd < v1;
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
        const int tb = 8 * t + g;
        b[d][t] = in && tb < n ? *reinterpret_cast<const uint2*>(acts + size_t(tb) * act_bytes +
                                                                 act_at + size_t(vd) * 16)
                               : make_uint2(0, 0);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int tc = 8 * t + 2 * q + p;
          m[d][t][p] =
              in && tc < n
                  ? reinterpret_cast<const float2*>(acts + size_t(tc) * act_bytes + meta_at)[vd]
                  : make_float2(0.f, 0.f);
        }
      }
      if constexpr (!PF) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) load_affine(vd, in, r, h, now.s[d][r][h], now.bias[d][r][h]);
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (v + d >= v1) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t(&pair)[2] = now.code[d][r];  // rows g and g + 8
        const uint32_t a[4] = {pair[0] & 0x0F0F0F0Fu, pair[1] & 0x0F0F0F0Fu,
                               (pair[0] >> 4) & 0x0F0F0F0Fu, (pair[1] >> 4) & 0x0F0F0F0Fu};
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          int c[4];
          mma_s8(c, a, b[d][t].x, b[d][t].y);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 mt = m[d][t][i % 2];
            const int h = i / 2;
            acc[r][t][i] = fmaf(small_int_float(c[i]), now.s[d][r][h] * mt.x,
                                fmaf(now.bias[d][r][h], mt.y, acc[r][t][i]));
          }
        }
      }
    }
  }
  // One row tile at a time (all R at once would pass 48 KB of shared
  // memory). Element e: token tile, lane and C slot; c0, c1 are row g at
  // tokens 2q, 2q + 1, c2, c3 row g + 8.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][t][lane][i] = acc[r][t][i];
    __syncthreads();
    for (int e = int(threadIdx.x); e < TILES * 128; e += kWarps * 32) {
      const int t = e / 128, l = (e / 4) % 32, i = e % 4;
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) sum += partial[k][t][l][i];
      const int out_row = int(blockIdx.x) * 16 * R + 16 * r + l / 4 + 8 * (i / 2),
                token = 8 * t + 2 * (l % 4) + i % 2;
      if (out_row < rows && token < n) y[size_t(token) * size_t(rows) + size_t(out_row)] = sum;
    }
  }
}

template <int TILES>
void launch_tiles(const AffineMatrix& w, const uint8_t* acts, size_t act_bytes, int64_t n, float* y,
                  cudaStream_t stream) {
  // The most rows a warp takes while the grid still gives every SM a block:
  // 16-row tiles up to 4, 2 at 32 tokens (4 took 250 registers), and at
  // most TANDEM_CUDA_AFFINE_MMA_ROW_TILES (1, 2 or 4; for measuring: more
  // tiles a warp share its activation loads, fewer give each block's warps
  // more blocks of columns in flight).
  static const int64_t cap = env_count("TANDEM_CUDA_AFFINE_MMA_ROW_TILES", 4);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const int64_t sms = std::max(1, launch_limits(device).multiprocessors);
  auto blocks = [&](int r) { return (w.rows + 16 * r - 1) / (16 * r); };
  const int most = int(std::min<int64_t>(TILES > 2 ? 2 : 4, std::max<int64_t>(cap, 1)));
  const int r = most >= 4 && blocks(4) >= sms ? 4 : most >= 2 && blocks(2) >= sms ? 2 : 1;
  const int shift = affine::log2_exact(w.group);
  // Read at each launch (decode steps are captured once), so tests take both.
  const bool prefetch = env_is("TANDEM_CUDA_AFFINE_MMA_PREFETCH", "1");
  auto go = [&](auto kernel, int rr) {
    launch(kernel, unsigned(blocks(rr)), kWarps * 32, 0, stream, w.data, w.scales, w.biases, shift,
           int(w.rows), int(w.cols), acts, int(act_bytes), int(n), y);
  };
  auto go_r = [&](auto pf) {
    constexpr bool PF = decltype(pf)::value;
    if constexpr (TILES <= 2) {
      if (r == 4) return go(affine_mma_kernel<TILES, 4, PF>, 4);
    }
    if (r == 2)
      go(affine_mma_kernel<TILES, 2, PF>, 2);
    else
      go(affine_mma_kernel<TILES, 1, PF>, 1);
  };
  if (prefetch)
    go_r(std::true_type{});
  else
    go_r(std::false_type{});
}

}  // namespace

bool affine_mma_takes(const AffineMatrix& w, int64_t n) {
  return w.bits == 4 && n >= 1 && n <= kAffineMmaMaxTokens && w.rows <= INT32_MAX &&
         w.cols <= INT32_MAX;
}

void launch_affine_mma(const AffineMatrix& w, const uint8_t* acts, size_t act_bytes, int64_t n,
                       float* y, cudaStream_t stream) {
  if (n <= 16)
    launch_tiles<2>(w, acts, act_bytes, n, y, stream);
  else
    launch_tiles<4>(w, acts, act_bytes, n, y, stream);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
