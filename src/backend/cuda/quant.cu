// Affine 4- and 8-bit weights on the device (MLX layout; GGUF Q8_0, Q4_0 and
// Q4_K are re-packed into it on load): the dequantization to bf16 tiles that
// prefill and batched steps feed to cuBLAS, and the embedding gather. The
// decode GEMV over the packed codes is gemv_affine.cu.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

// out[r, c] = bf16(scale · q + bias) for rows r0 .. r0 + m (out row 0 is r0),
// and the rounding's remainder in out_lo when set. A thread per 16-byte
// vector of codes (affine::Vec: one group's 32 or 16 columns), written as
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
  using V = affine::Vec<BITS>;
  constexpr int C = V::kCodes, VC = V::kVecCols;
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
      affine::unpack_word<BITS>(words[k4], q);
#pragma unroll
      for (int j = 0; j < C; j += 2) {
        const float v0 = __fadd_rn(__fmul_rn(s, q[j]), b),
                    v1 = __fadd_rn(__fmul_rn(s, q[j + 1]), b);
        const uint32_t h0 = bf16_bits(v0), h1 = bf16_bits(v1);
        hi[(k4 * C + j) / 2] = h0 | h1 << 16;
        lo[(k4 * C + j) / 2] = bf16_bits(v0 - bf16_value(h0)) | bf16_bits(v1 - bf16_value(h1))
                                                                    << 16;
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

}  // namespace

void dequantize_affine_bf16(const AffineMatrix& w, int64_t r0, int64_t m, uint16_t* out,
                            uint16_t* out_lo, cudaStream_t stream) {
  if (m <= 0) return;
  affine::check(w, "dequantize_affine_bf16");
  if (m * w.cols > INT32_MAX)
    fail("dequantize_affine_bf16: a tile of %lld rows is too large", (long long)m);
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0 || reinterpret_cast<uintptr_t>(out_lo) % 16 != 0)
    fail("dequantize_affine_bf16: output tiles are not 16-byte aligned");
  const int64_t vecs = m * w.cols / (128 / w.bits);
  const unsigned blocks = unsigned(std::min<int64_t>((vecs + 255) / 256, 65535 * 4));
  const auto* codes = reinterpret_cast<const uint4*>(w.data);
  if (w.bits == 4)
    launch(dequantize_bf16_kernel<4>, blocks, 256, 0, stream, codes, w.scales, w.biases,
           affine::log2_exact(w.group), r0, m, w.cols, out, out_lo);
  else
    launch(dequantize_bf16_kernel<8>, blocks, 256, 0, stream, codes, w.scales, w.biases,
           affine::log2_exact(w.group), r0, m, w.cols, out, out_lo);
}

void embed_rows_affine(const AffineMatrix& w, const int32_t* ids, int64_t n, float factor,
                       float* out, cudaStream_t stream) {
  if (n <= 0) return;
  affine::check(w, "embed_rows_affine");
  if (w.bits == 4)
    launch(embed_affine_kernel<4>, unsigned(n), 256, 0, stream, w.data, w.scales, w.biases, w.group,
           w.cols, ids, factor, out);
  else
    launch(embed_affine_kernel<8>, unsigned(n), 256, 0, stream, w.data, w.scales, w.biases, w.group,
           w.cols, ids, factor, out);
}

}  // namespace tandem::cuda
