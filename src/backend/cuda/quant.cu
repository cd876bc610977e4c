// Affine 4- and 8-bit weights on the device (MLX layout; GGUF Q8_0, Q4_0 and
// Q4_K are re-packed into it on load): the decode GEMV that streams the
// packed codes, the dequantization to bf16 tiles that prefill feeds to
// cuBLAS, and the embedding gather.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxBatch = 8;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Code j (j < 128 / BITS) of a 16-byte chunk.
template <int BITS>
__device__ __forceinline__ float code(const uint4& v, int j) {
  constexpr int per_word = 32 / BITS;
  const uint32_t word = j / per_word == 0   ? v.x
                        : j / per_word == 1 ? v.y
                        : j / per_word == 2 ? v.z
                                            : v.w;
  return float((word >> (BITS * (j % per_word))) & ((1u << BITS) - 1u));
}

// One warp per output row; each lane takes 16-byte chunks of the packed row
// (32 codes at 4 bits, 16 at 8), all inside one group since groups are
// multiples of 32 codes: acc += scale · Σ q·x + bias · Σ x. UNROLL chunks
// per lane are in flight at once; the first of them go out before the PDL
// wait (weights are never written).
template <int N, int BITS, int UNROLL>
__global__ void gemv_affine_kernel(const uint4* __restrict__ W, const float* __restrict__ scales,
                                   const float* __restrict__ biases, int group, int64_t rows,
                                   int64_t cols, const float* __restrict__ x,
                                   float* __restrict__ y) {
  constexpr int K = 128 / BITS;  // codes per chunk
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (row >= rows) {
    pdl_wait();
    return;
  }
  const int64_t chunks = cols / K, groups = cols / group;
  const uint4* w = W + row * chunks;
  const float* sc = scales + row * groups;
  const float* bi = biases + row * groups;
  float acc[N];
#pragma unroll
  for (int t = 0; t < N; ++t) acc[t] = 0.f;
  int64_t i = lane;
  uint4 v[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
    if (i + 32 * u < chunks) v[u] = __ldg(w + i + 32 * u);
  pdl_wait();
  for (; i < chunks; i += 32 * UNROLL) {
    if (i != lane) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (i + 32 * u < chunks) v[u] = __ldg(w + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t c = i + 32 * u;
      if (c >= chunks) break;
      const int64_t c0 = c * K, g = c0 / group;
      const float s = __ldg(sc + g), b = __ldg(bi + g);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const float4* xp = reinterpret_cast<const float4*>(x + t * cols + c0);
        float qx = 0.f, sx = 0.f;
#pragma unroll
        for (int j4 = 0; j4 < K / 4; ++j4) {
          const float4 a = __ldg(xp + j4);
          qx += code<BITS>(v[u], 4 * j4) * a.x + code<BITS>(v[u], 4 * j4 + 1) * a.y +
                code<BITS>(v[u], 4 * j4 + 2) * a.z + code<BITS>(v[u], 4 * j4 + 3) * a.w;
          sx += a.x + a.y + a.z + a.w;
        }
        acc[t] += s * qx + b * sx;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * rows + row] = s;
  }
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
                                       int64_t m, int64_t cols, uint16_t* __restrict__ out) {
  pdl_launch_dependents();
  pdl_wait();
  constexpr int per_word = 32 / BITS;
  const int64_t words = cols / per_word, groups = cols / group;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < m * words;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / words, wi = k % words, row = r0 + r;
    const uint32_t word = W[row * words + wi];
    const int64_t c0 = wi * per_word, g = c0 / group;
    const float s = scales[row * groups + g], b = biases[row * groups + g];
#pragma unroll
    for (int j = 0; j < per_word; ++j)
      out[r * cols + c0 + j] =
          to_bf16(__fadd_rn(__fmul_rn(s, float((word >> (BITS * j)) & ((1u << BITS) - 1u))), b));
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

template <int N, int BITS>
void launch_gemv(const AffineMatrix& w, const float* x, float* y, cudaStream_t stream) {
  const unsigned blocks = unsigned((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch(gemv_affine_kernel<N, BITS, 4>, blocks, kWarpsPerBlock * 32, 0, stream,
         reinterpret_cast<const uint4*>(w.data), w.scales, w.biases, w.group, w.rows, w.cols, x, y);
}

template <int BITS>
void gemv_bits(const AffineMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream) {
  for (int64_t t0 = 0; t0 < n; t0 += kMaxBatch) {
    const int64_t m = n - t0 < kMaxBatch ? n - t0 : kMaxBatch;
    const float* xt = x + t0 * w.cols;
    float* yt = y + t0 * w.rows;
    switch (m) {
      case 1: launch_gemv<1, BITS>(w, xt, yt, stream); break;
      case 2: launch_gemv<2, BITS>(w, xt, yt, stream); break;
      case 3: launch_gemv<3, BITS>(w, xt, yt, stream); break;
      case 4: launch_gemv<4, BITS>(w, xt, yt, stream); break;
      case 5: launch_gemv<5, BITS>(w, xt, yt, stream); break;
      case 6: launch_gemv<6, BITS>(w, xt, yt, stream); break;
      case 7: launch_gemv<7, BITS>(w, xt, yt, stream); break;
      default: launch_gemv<8, BITS>(w, xt, yt, stream); break;
    }
  }
}

void check(const AffineMatrix& w, const char* what) {
  if ((w.bits != 4 && w.bits != 8) || (w.group != 32 && w.group != 64 && w.group != 128) ||
      w.cols % w.group != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0)
    fail("%s: affine weights of %d bits, group %d, %lld columns are not supported", what, w.bits,
         w.group, (long long)w.cols);
}

}  // namespace

void gemv_affine(const AffineMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (w.rows <= 0 || n <= 0) return;
  check(w, "gemv_affine");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    fail("gemv_affine: activations are not 16-byte aligned");
  if (w.bits == 4)
    gemv_bits<4>(w, x, n, y, stream);
  else
    gemv_bits<8>(w, x, n, y, stream);
}

void dequantize_affine_bf16(const AffineMatrix& w, int64_t r0, int64_t m, uint16_t* out,
                            cudaStream_t stream) {
  if (m <= 0) return;
  check(w, "dequantize_affine_bf16");
  const int64_t words = m * w.cols / (32 / w.bits);
  const unsigned blocks = unsigned(std::min<int64_t>((words + 255) / 256, 65535 * 4));
  if (w.bits == 4)
    launch(dequantize_bf16_kernel<4>, blocks, 256, 0, stream, w.data, w.scales, w.biases, w.group,
           r0, m, w.cols, out);
  else
    launch(dequantize_bf16_kernel<8>, blocks, 256, 0, stream, w.data, w.scales, w.biases, w.group,
           r0, m, w.cols, out);
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
