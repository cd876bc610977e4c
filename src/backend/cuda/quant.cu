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

// Where gemv_affine_kernel stages its activations: a lane's 16-byte load
// of codes (4 words) covers kVecCols columns, whose activations sit in
// shared memory as kSpan floats (the columns, then 4 floats of padding).
// The padding puts neighbouring lanes' float4 reads on distinct banks: a
// lane reads its columns at kSpan-float strides from its neighbour's, 36
// (4-bit) or 20 (8-bit) floats, so the 8 lanes of a 128-byte phase touch 8
// distinct 4-bank groups; unpadded, every lane would hit the same banks.
template <int BITS>
struct AffineLayout {
  static constexpr int kCodes = 32 / BITS;     // codes a word
  static constexpr int kVecCols = 4 * kCodes;  // columns a 16-byte load: 32 or 16
  static constexpr int kSpan = kVecCols + 4;
  // Floats of one staged batch row of `cols` columns (a multiple of kVecCols).
  __host__ __device__ static int pitch(int cols) { return cols / kVecCols * kSpan; }
  // The staged index of column c.
  __device__ static int at(int c) { return c / kVecCols * kSpan + c % kVecCols; }
};

// y[t, r] = Σ_c (scale[r, g(c)] · q[r, c] + bias[r, g(c)]) · x[t, c], with
// the fusions of GemvFusion: each weight is dequantized once (one fma) and
// used for every batch row; the factored form scale · Σ q·x + bias · Σ x cost
// as much and lost accuracy to cancellation between its two terms. A warp
// streams ROWS rows (WarpRows: one, or a gate/up pair when gated). Lane i
// loads each row's 16-byte vectors i, i + 32, ... (32 codes at 4 bits, 16
// at 8, always inside one group since groups are multiples of 32 columns),
// UNROLL vectors per row in flight, the first of them issued before the PDL
// wait (weights are never written). The block first stages the activations
// (times the norm weight when normalizing, with their sums of squares) in
// shared memory (AffineLayout), where a lane's 32 columns are one padded
// span: read from global memory, a lane's activations sat 128 bytes from its
// neighbour's and every load touched 32 cache lines, which is why the kernel
// used to load one 4-byte word a lane — and that many loads (a quarter of the
// bytes a load of the bf16 GEMV's) held it to the bf16 GEMV's time for a
// quarter of its bytes. Index math is 32-bit with the group size as a shift.
// SPLIT warps share a unit's vectors (ColumnShare) when its rows alone would
// leave SMs short of warps.
template <int N, int BITS, int ROWS, int UNROLL, bool GATED, int SPLIT>
__global__ void gemv_affine_kernel(const uint4* __restrict__ W, const float* __restrict__ scales,
                                   const float* __restrict__ biases, int group_shift, int rows,
                                   int cols, const float* __restrict__ x, float* y, GemvFusion f) {
  using L = AffineLayout<BITS>;
  constexpr int C = L::kCodes, VC = L::kVecCols;
  extern __shared__ __align__(16) float staged[];  // [N][pitch]
  __shared__ float partial[kWarpsPerBlock][N];
  const WarpRows<ROWS, GATED> wr(ColumnShare<SPLIT>::unit(), rows);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int row_vecs = cols / VC, groups = cols >> group_shift, pitch = L::pitch(cols);
  const ColumnShare<SPLIT> share(row_vecs);
  const int first = int(share.first), count = int(share.count);  // this warp's vectors
  const uint4* w[ROWS];
  const float *sc[ROWS], *bi[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = int(wr.row(r));
    w[r] = W + size_t(row) * size_t(row_vecs) + first;
    sc[r] = scales + size_t(row) * size_t(groups);
    bi[r] = biases + size_t(row) * size_t(groups);
  }
  pdl_launch_dependents();
  // Every warp loads (a unit past the end reads its clamped last row) and
  // stays for the staging barrier.
  uint4 v[ROWS][UNROLL];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (lane + 32 * u < count) v[r][u] = __ldg(w[r] + lane + 32 * u);
  pdl_wait();

  // Stage x (· the norm weight) and sum its squares per batch row.
  float sq[N];
#pragma unroll
  for (int t = 0; t < N; ++t) sq[t] = 0.f;
  const float4* gw = f.normalize ? reinterpret_cast<const float4*>(f.norm_weight) : nullptr;
  for (int i = int(threadIdx.x); i < cols / 4; i += int(blockDim.x)) {
    const float4 g = gw ? __ldg(gw + i) : make_float4(1.f, 1.f, 1.f, 1.f);
    const int at = L::at(4 * i);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float4 a = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * size_t(cols)) + i);
      sq[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
      a.x *= g.x, a.y *= g.y, a.z *= g.z, a.w *= g.w;
      *reinterpret_cast<float4*>(staged + t * pitch + at) = a;
    }
  }
  if (f.normalize) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float s = warp_sum(sq[t]);
      if (lane == 0) partial[warp][t] = s;
    }
  }
  __syncthreads();
  float acc[ROWS][N], ss[N];
  zero_sums(acc, ss);
  // finish() and gather_split() sum ss over lanes and split warps: the row's
  // total goes to lane 0 of each unit's first warp only.
  if (f.normalize && lane == 0 && warp % SPLIT == 0) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float total = 0.f;
#pragma unroll
      for (int j = 0; j < kWarpsPerBlock; ++j) total += partial[j][t];
      ss[t] = total;
    }
  }
  if (SPLIT == 1 && !wr.any()) return;  // split warps meet at gather_split's barrier

  const float* xw = staged + first * L::kSpan;
  for (int i = lane; i < count; i += 32 * UNROLL) {
    if (i != lane) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
          if (i + 32 * u < count) v[r][u] = __ldg(w[r] + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = i + 32 * u;
      if (c >= count) break;
      const int g = ((first + c) * VC) >> group_shift;
      float s[ROWS], b[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) s[r] = __ldg(sc[r] + g), b[r] = __ldg(bi[r] + g);
      const float* xc = xw + c * L::kSpan;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float wq[ROWS][C];  // word k's weights, scale · q + bias
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const uint32_t word = k == 0   ? v[r][u].x
                                : k == 1 ? v[r][u].y
                                : k == 2 ? v[r][u].z
                                         : v[r][u].w;
          unpack_word<BITS>(word, wq[r]);
#pragma unroll
          for (int j = 0; j < C; ++j) wq[r][j] = fmaf(s[r], wq[r][j], b[r]);
        }
#pragma unroll
        for (int t = 0; t < N; ++t) {
          const float4* xp = reinterpret_cast<const float4*>(xc + t * pitch + k * C);
#pragma unroll
          for (int j = 0; j < C / 4; ++j) {
            const float4 a = xp[j];
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
              acc[r][t] += wq[r][4 * j] * a.x + wq[r][4 * j + 1] * a.y + wq[r][4 * j + 2] * a.z +
                           wq[r][4 * j + 3] * a.w;
          }
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

// out[r, c] = bf16(scale · q + bias) for rows r0 .. r0 + m (out row 0 is r0),
// and the rounding's remainder in out_lo when set. A thread per 16-byte
// vector of codes (AffineLayout: one group's 32 or 16 columns), written as
// 16-byte stores of 8 values. One word a thread with a 2-byte store a value
// (and an int-to-float conversion each) held llama-3.2-1b q4 at 32 sequences
// to 2,046-2,157 tok/s (earlier sessions); this kernel: 8,502 (H200).
template <int BITS>
__global__ void dequantize_bf16_kernel(const uint4* __restrict__ W,
                                       const float* __restrict__ scales,
                                       const float* __restrict__ biases, int group_shift,
                                       int64_t r0, int64_t m, int64_t cols,
                                       uint16_t* __restrict__ out, uint16_t* __restrict__ out_lo) {
  pdl_launch_dependents();
  pdl_wait();
  using L = AffineLayout<BITS>;
  constexpr int C = L::kCodes, VC = L::kVecCols;
  const int row_vecs = int(cols) / VC, groups = int(cols) >> group_shift;
  const int total = int(m) * row_vecs;  // a tile: at most 32M weights
  for (int k = int(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += gridDim.x * blockDim.x) {
    const int r = k / row_vecs, vi = k - r * row_vecs;
    const size_t row = size_t(r0 + r);
    const uint4 codes = __ldg(W + row * size_t(row_vecs) + size_t(vi));
    const int g = (vi * VC) >> group_shift;
    const float s = __ldg(scales + row * size_t(groups) + size_t(g)),
                b = __ldg(biases + row * size_t(groups) + size_t(g));
    uint4* hi_out = reinterpret_cast<uint4*>(out + size_t(r) * size_t(cols) + size_t(vi) * VC);
    uint4* lo_out =
        out_lo ? reinterpret_cast<uint4*>(out_lo + size_t(r) * size_t(cols) + size_t(vi) * VC)
               : nullptr;
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
    uint32_t hi[C / 2 * 4], lo[C / 2 * 4];  // the vector's values as bf16 pairs
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
      float q[C];
      unpack_word<BITS>(words[k4], q);
#pragma unroll
      for (int j = 0; j < C; j += 2) {
        const float v0 = __fadd_rn(__fmul_rn(s, q[j]), b),
                    v1 = __fadd_rn(__fmul_rn(s, q[j + 1]), b);
        const uint16_t h0 = to_bf16(v0), h1 = to_bf16(v1);
        hi[(k4 * C + j) / 2] = uint32_t(h0) | uint32_t(h1) << 16;
        const uint16_t l0 = to_bf16(v0 - __uint_as_float(uint32_t(h0) << 16)),
                       l1 = to_bf16(v1 - __uint_as_float(uint32_t(h1) << 16));
        lo[(k4 * C + j) / 2] = uint32_t(l0) | uint32_t(l1) << 16;
      }
    }
#pragma unroll
    for (int i = 0; i < VC / 8; ++i) {
      hi_out[i] = make_uint4(hi[4 * i], hi[4 * i + 1], hi[4 * i + 2], hi[4 * i + 3]);
      if (lo_out) lo_out[i] = make_uint4(lo[4 * i], lo[4 * i + 1], lo[4 * i + 2], lo[4 * i + 3]);
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

// Shared memory gemv_affine_kernel stages for n batch rows of `cols`.
template <int BITS>
size_t affine_staged_bytes(int64_t n, int64_t cols) {
  return size_t(n) * size_t(AffineLayout<BITS>::pitch(int(cols))) * sizeof(float);
}

// A 2,048-column row is 64 vectors at 4 bits: 2 per lane, all in flight
// with the other row of a gate/up pair. Batches of up to kMaxSplitBatch rows
// split a unit's vectors over warps when it has few rows (gemv_affine_split).
template <int N, int BITS, bool GATED>
void launch_gemv(const AffineMatrix& w, const float* x, float* y, const GemvFusion& f,
                 cudaStream_t stream) {
  constexpr int kRows = GATED ? 2 : 1;
  constexpr int kUnroll = (N <= 2 ? 4 : 2) / kRows;
  const int64_t units = WarpRows<kRows, GATED>::units(w.rows);
  const size_t smem = affine_staged_bytes<BITS>(N, w.cols);
  with_split(gemv_affine_split(w, N, GATED), [&](auto s) {
    constexpr int S = decltype(s)::value;
    if constexpr (S == 1 || N <= kMaxSplitBatch) {
      constexpr int kUnits = ColumnShare<S>::kUnitsPerBlock;
      const unsigned blocks = unsigned((units + kUnits - 1) / kUnits);
      const auto kernel = gemv_affine_kernel<N, BITS, kRows, kUnroll, GATED, S>;
      if (smem > (size_t(48) << 10))
        allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
      launch(kernel, blocks, kWarpsPerBlock * 32, smem, stream,
             reinterpret_cast<const uint4*>(w.data), w.scales, w.biases, log2_exact(w.group),
             int(w.rows), int(w.cols), x, y, f);
    }
  });
}

template <int BITS>
void gemv_bits(const AffineMatrix& w, const float* x, int64_t n, float* y, const GemvFusion& f,
               cudaStream_t stream) {
  const bool gated = f.gate != GemvGate::None;
  const int64_t outputs = gated ? w.rows / 2 : w.rows;
  // As many batch rows a launch as their staged activations fit the opt-in
  // shared memory (less 4 KiB of static memory): all 8 up to 6,400 columns.
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const size_t room = launch_limits(device).smem_optin - (size_t(4) << 10);
  const int64_t most = int64_t(room / affine_staged_bytes<BITS>(1, w.cols));
  if (most < 1)
    fail("gemv_affine: %lld columns of activations do not fit the device's shared memory",
         (long long)w.cols);
  for_batch_runs(
      n,
      [&](auto run, int64_t t0) {
        constexpr int N = decltype(run)::value;
        if (gated)
          launch_gemv<N, BITS, true>(w, x + t0 * w.cols, y + t0 * outputs, f, stream);
        else
          launch_gemv<N, BITS, false>(w, x + t0 * w.cols, y + t0 * outputs, f, stream);
      },
      most);
}

void check(const AffineMatrix& w, const char* what) {
  if ((w.bits != 4 && w.bits != 8) || (w.group != 32 && w.group != 64 && w.group != 128) ||
      w.cols % w.group != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    fail(
        "%s: affine weights of %d bits, group %d, %lld columns (codes 16-byte aligned: %s) are "
        "not supported",
        what, w.bits, w.group, (long long)w.cols,
        reinterpret_cast<uintptr_t>(w.data) % 16 == 0 ? "yes" : "no");
}

}  // namespace

int gemv_affine_split(const AffineMatrix& w, int64_t n, bool gated) {
  if (n > kMaxSplitBatch) return 1;
  // launch_gemv's warp units: one row, or a gate/up pair, a warp.
  const int64_t units =
      gated ? WarpRows<2, true>::units(w.rows) : WarpRows<1, false>::units(w.rows);
  // At least 16 vectors (64 words) a warp.
  return column_split(units, w.cols / (128 / w.bits), 16);
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
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0 || reinterpret_cast<uintptr_t>(out_lo) % 16 != 0)
    fail("dequantize_affine_bf16: output tiles are not 16-byte aligned");
  const int64_t vecs = m * w.cols / (128 / w.bits);
  const unsigned blocks = unsigned(std::min<int64_t>((vecs + 255) / 256, 65535 * 4));
  const auto* codes = reinterpret_cast<const uint4*>(w.data);
  if (w.bits == 4)
    launch(dequantize_bf16_kernel<4>, blocks, 256, 0, stream, codes, w.scales, w.biases,
           log2_exact(w.group), r0, m, w.cols, out, out_lo);
  else
    launch(dequantize_bf16_kernel<8>, blocks, 256, 0, stream, codes, w.scales, w.biases,
           log2_exact(w.group), r0, m, w.cols, out, out_lo);
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
