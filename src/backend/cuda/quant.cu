// Affine 4- and 8-bit weights on the device (MLX layout; GGUF Q8_0, Q4_0 and
// Q4_K are re-packed into it on load): the decode GEMV that streams the
// packed codes, the dequantization to bf16 tiles that prefill feeds to
// cuBLAS, and the embedding gather.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv_fusion.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace {

using namespace gemv;

// Code j of a packed word as a float, without an int-to-float conversion
// (a quarter-rate instruction): the code's byte goes under the exponent of
// 2^23, whose float is then exactly 2^23 + code.
__device__ __forceinline__ float code_byte(uint32_t word, int k) {
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | unsigned(k))) - 8388608.f;
}

// The 32 / BITS codes of a packed word, in column order (MLX packs the
// lowest bits first).
template <int BITS>
__device__ __forceinline__ void unpack_word(uint32_t word, float (&q)[32 / BITS]) {
  if constexpr (BITS == 4) {
    const uint32_t even = word & 0x0F0F0F0Fu, odd = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      q[2 * b] = code_byte(even, b);
      q[2 * b + 1] = code_byte(odd, b);
    }
  } else {
#pragma unroll
    for (int b = 0; b < 4; ++b) q[b] = code_byte(word, b);
  }
}

// y[t, r] = Σ_c (scale[r, g(c)] · q[r, c] + bias[r, g(c)]) · x[t, c], with
// the fusions of GemvFusion: each weight is dequantized once (one fma) and
// used for every batch row; the factored form scale · Σ q·x + bias · Σ x cost
// as much and lost accuracy to cancellation between its two terms. A warp
// streams ROWS rows (WarpRows: one, or a gate/up pair when gated). Lane i
// takes each row's 32-bit words i, i + 32, ... (8 codes at 4 bits, 4 at 8,
// always inside one group since groups are multiples of 32 columns), UNROLL
// words per row in flight, the first of them issued before the PDL wait
// (weights are never written). Consecutive lanes read consecutive words, so
// a warp's activation loads for them cover one contiguous span: with a
// 16-byte chunk per lane, each lane's activations sat 128 bytes from its
// neighbour's and every load touched 32 cache lines, which held the kernel
// to a tenth of the bandwidth. Index math is 32-bit with the group size as a
// shift. SPLIT warps share a unit's words (ColumnShare) when its rows alone
// would leave SMs short of warps.
template <int N, int BITS, int ROWS, int UNROLL, bool GATED, int SPLIT>
__global__ void gemv_affine_kernel(const uint32_t* __restrict__ W, const float* __restrict__ scales,
                                   const float* __restrict__ biases, int group_shift, int rows,
                                   int cols, const float* __restrict__ x, float* y, GemvFusion f) {
  constexpr int C = 32 / BITS;  // codes per word
  constexpr int kWordShift = BITS == 4 ? 3 : 2;
  const WarpRows<ROWS, GATED> wr(ColumnShare<SPLIT>::unit(), rows);
  const int lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (SPLIT == 1 && !wr.any()) return;  // split warps meet at gather_split's barrier
  const int row_words = cols / C, groups = cols >> group_shift;
  const ColumnShare<SPLIT> share(row_words);
  const int first = int(share.first), words = int(share.count);  // this warp's words
  const int word_group_shift = group_shift - kWordShift;         // word index -> group index
  const uint32_t* w[ROWS];
  const float *sc[ROWS], *bi[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = int(wr.row(r));
    w[r] = W + size_t(row) * size_t(row_words) + first;
    sc[r] = scales + size_t(row) * size_t(groups);
    bi[r] = biases + size_t(row) * size_t(groups);
  }
  x += size_t(first) * C;
  const float* norm_weight = f.norm_weight ? f.norm_weight + size_t(first) * C : nullptr;
  float acc[ROWS][N], ss[N];
  zero_sums(acc, ss);
  uint32_t v[ROWS][UNROLL];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (lane + 32 * u < words) v[r][u] = __ldg(w[r] + lane + 32 * u);
  pdl_wait();
  for (int i = lane; i < words; i += 32 * UNROLL) {
    if (i != lane) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (i + 32 * u < words) v[r][u] = __ldg(w[r] + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = i + 32 * u;
      if (c >= words) break;
      const int g = (first + c) >> word_group_shift;
      float wq[ROWS][C];  // the word's weights, scale · q + bias
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float s = __ldg(sc[r] + g), b = __ldg(bi[r] + g);
        unpack_word<BITS>(v[r][u], wq[r]);
#pragma unroll
        for (int j = 0; j < C; ++j) wq[r][j] = fmaf(s, wq[r][j], b);
      }
      float4 gw[C / 4];  // the norm weight over the word's columns
#pragma unroll
      for (int j = 0; j < C / 4; ++j)
        gw[j] = f.normalize && norm_weight
                    ? __ldg(reinterpret_cast<const float4*>(norm_weight + size_t(c) * C) + j)
                    : make_float4(1.f, 1.f, 1.f, 1.f);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const float4* xp =
            reinterpret_cast<const float4*>(x + size_t(t) * size_t(cols) + size_t(c) * C);
#pragma unroll
        for (int j = 0; j < C / 4; ++j) {
          float4 a = __ldg(xp + j);
          if (f.normalize) {
            ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            a.x *= gw[j].x, a.y *= gw[j].y, a.z *= gw[j].z, a.w *= gw[j].w;
          }
#pragma unroll
          for (int r = 0; r < ROWS; ++r)
            acc[r][t] += wq[r][4 * j] * a.x + wq[r][4 * j + 1] * a.y + wq[r][4 * j + 2] * a.z +
                         wq[r][4 * j + 3] * a.w;
        }
      }
    }
  }
  if (!gather_split<N, ROWS, SPLIT>(acc, ss)) return;
  finish<N, ROWS, GATED>(wr, acc, ss, cols, f, y);
}

__device__ __forceinline__ uint16_t to_bf16(float f) {
  const uint32_t b = __float_as_uint(f);
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);  // nearest even
}

// out[r, c] = bf16(scale · q + bias) for rows r0 .. r0 + m (out row 0 is r0).
template <int BITS>
__global__ void dequantize_bf16_kernel(const uint32_t* __restrict__ W,
                                       const float* __restrict__ scales,
                                       const float* __restrict__ biases, int group, int64_t r0,
                                       int64_t m, int64_t cols, uint16_t* __restrict__ out,
                                       uint16_t* __restrict__ out_lo) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int per_word = 32 / BITS;
  const int words = int(cols) / per_word, groups = int(cols) / group;
  const int total = int(m) * words;  // a tile: at most 32M weights
  for (int k = int(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += gridDim.x * blockDim.x) {
    const int r = k / words, wi = k - r * words;
    const size_t row = size_t(r0 + r);
    const uint32_t word = W[row * size_t(words) + size_t(wi)];
    const int c0 = wi * per_word, g = c0 / group;
    const float s = scales[row * size_t(groups) + size_t(g)],
                b = biases[row * size_t(groups) + size_t(g)];
    const size_t at = size_t(r) * size_t(cols) + size_t(c0);
#pragma unroll
    for (int j = 0; j < per_word; ++j) {
      const float v = __fadd_rn(__fmul_rn(s, float((word >> (BITS * j)) & ((1u << BITS) - 1u))), b);
      const uint16_t hi = to_bf16(v);
      out[at + j] = hi;
      if (out_lo) out_lo[at + j] = to_bf16(v - __uint_as_float(uint32_t(hi) << 16));
    }
  }
}

// out[t] = (scale · q + bias)[ids[t]] · factor, one block per token; the
// products and sums rounded separately, as the CPU's dequantize_row.
template <int BITS>
__global__ void embed_affine_kernel(const uint32_t* __restrict__ W,
                                    const float* __restrict__ scales,
                                    const float* __restrict__ biases, int group, int64_t cols,
                                    const int32_t* __restrict__ ids, float factor,
                                    float* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int per_word = 32 / BITS;
  const int64_t row = ids[blockIdx.x], words = cols / per_word, groups = cols / group;
  float* o = out + int64_t(blockIdx.x) * cols;
  for (int64_t wi = threadIdx.x; wi < words; wi += blockDim.x) {
    const uint32_t word = W[row * words + wi];
    const int64_t c0 = wi * per_word, g = c0 / group;
    const float s = scales[row * groups + g], b = biases[row * groups + g];
#pragma unroll
    for (int j = 0; j < per_word; ++j)
      o[c0 + j] = __fmul_rn(
          __fadd_rn(__fmul_rn(s, float((word >> (BITS * j)) & ((1u << BITS) - 1u))), b), factor);
  }
}

int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// A 2,048-column row is 256 words at 4 bits: 8 per lane, all in flight
// (gated: 4 for each row of the pair). Batches of up to kMaxSplitBatch rows
// split a unit's words over warps when it has few rows (gemv_affine_split).
template <int N, int BITS, bool GATED>
void launch_gemv(const AffineMatrix& w, const float* x, float* y, const GemvFusion& f,
                 cudaStream_t stream) {
  constexpr int kRows = GATED ? 2 : 1;
  constexpr int kUnroll = (N <= 2 ? 8 : 4) / kRows;
  const int64_t units = WarpRows<kRows, GATED>::units(w.rows);
  with_split(gemv_affine_split(w, N, GATED), [&](auto s) {
    constexpr int S = decltype(s)::value;
    if constexpr (S == 1 || N <= kMaxSplitBatch) {
      constexpr int kUnits = ColumnShare<S>::kUnitsPerBlock;
      const unsigned blocks = unsigned((units + kUnits - 1) / kUnits);
      launch(gemv_affine_kernel<N, BITS, kRows, kUnroll, GATED, S>, blocks, kWarpsPerBlock * 32, 0,
             stream, w.data, w.scales, w.biases, log2_exact(w.group), int(w.rows), int(w.cols), x,
             y, f);
    }
  });
}

template <int BITS>
void gemv_bits(const AffineMatrix& w, const float* x, int64_t n, float* y, const GemvFusion& f,
               cudaStream_t stream) {
  const bool gated = f.gate != GemvGate::None;
  const int64_t outputs = gated ? w.rows / 2 : w.rows;
  for_batch_runs(n, [&](auto run, int64_t t0) {
    constexpr int N = decltype(run)::value;
    if (gated)
      launch_gemv<N, BITS, true>(w, x + t0 * w.cols, y + t0 * outputs, f, stream);
    else
      launch_gemv<N, BITS, false>(w, x + t0 * w.cols, y + t0 * outputs, f, stream);
  });
}

void check(const AffineMatrix& w, const char* what) {
  if ((w.bits != 4 && w.bits != 8) || (w.group != 32 && w.group != 64 && w.group != 128) ||
      w.cols % w.group != 0 || reinterpret_cast<uintptr_t>(w.data) % 4 != 0)
    fail("%s: affine weights of %d bits, group %d, %lld columns are not supported", what, w.bits,
         w.group, (long long)w.cols);
}

}  // namespace

int gemv_affine_split(const AffineMatrix& w, int64_t n, bool gated) {
  if (n > kMaxSplitBatch) return 1;
  // launch_gemv's warp units: one row, or a gate/up pair, a warp.
  const int64_t units =
      gated ? WarpRows<2, true>::units(w.rows) : WarpRows<1, false>::units(w.rows);
  return column_split(units, w.cols / (32 / w.bits), 64);
}

void gemv_affine(const AffineMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                 const GemvFusion& fusion) {
  if (w.rows <= 0 || n <= 0) return;
  check(w, "gemv_affine");
  gemv::check_fusion(fusion, w.rows, "gemv_affine");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      (fusion.normalize && reinterpret_cast<uintptr_t>(fusion.norm_weight) % 16 != 0))
    fail("gemv_affine: activations or norm weight are not 16-byte aligned");
  if (w.rows > INT32_MAX || w.cols > INT32_MAX)
    fail("gemv_affine: a %lld x %lld matrix is too large for the kernel", (long long)w.rows,
         (long long)w.cols);
  if (w.bits == 4)
    gemv_bits<4>(w, x, n, y, fusion, stream);
  else
    gemv_bits<8>(w, x, n, y, fusion, stream);
}

void dequantize_affine_bf16(const AffineMatrix& w, int64_t r0, int64_t m, uint16_t* out,
                            uint16_t* out_lo, cudaStream_t stream) {
  if (m <= 0) return;
  check(w, "dequantize_affine_bf16");
  if (m * w.cols > INT32_MAX)
    fail("dequantize_affine_bf16: a tile of %lld rows is too large", (long long)m);
  const int64_t words = m * w.cols / (32 / w.bits);
  const unsigned blocks = unsigned(std::min<int64_t>((words + 255) / 256, 65535 * 4));
  if (w.bits == 4)
    launch(dequantize_bf16_kernel<4>, blocks, 256, 0, stream, w.data, w.scales, w.biases, w.group,
           r0, m, w.cols, out, out_lo);
  else
    launch(dequantize_bf16_kernel<8>, blocks, 256, 0, stream, w.data, w.scales, w.biases, w.group,
           r0, m, w.cols, out, out_lo);
}

void embed_rows_affine(const AffineMatrix& w, const int32_t* ids, int64_t n, float factor,
                       float* out, cudaStream_t stream) {
  if (n <= 0) return;
  check(w, "embed_rows_affine");
  if (w.bits == 4)
    launch(embed_affine_kernel<4>, unsigned(n), 256, 0, stream, w.data, w.scales, w.biases, w.group,
           w.cols, ids, factor, out);
  else
    launch(embed_affine_kernel<8>, unsigned(n), 256, 0, stream, w.data, w.scales, w.biases, w.group,
           w.cols, ids, factor, out);
}

}  // namespace tandem::cuda
