// What the kernels over packed affine codes (MLX layout: gemv_affine.cu,
// quant.cu) share: unpacking a 32-bit word of codes, the 16-byte vectors a
// thread loads, and the host checks of an AffineMatrix. Included only by .cu
// files.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace tandem::cuda::affine {

// Code k of a packed word's bytes as a float, without an int-to-float
// conversion (a quarter-rate instruction): the code's byte goes under the
// exponent of 2^23, whose float is then exactly 2^23 + code.
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

// The int8 rule for a block of 32 activations whose largest magnitude is
// amax: each value's code is x · inverse_scale rounded to nearest even, and
// the block's scale d = amax / 127 (gemv_affine's quantize kernel, and the
// attention kernels that write the o projection's input: the same bits).
__device__ __forceinline__ float int8_inverse_scale(float amax) {
  return amax > 0.f ? 127.0f / amax : 0.f;
}
__device__ __forceinline__ int int8_code(float x, float inverse_scale) {
  return __float2int_rn(x * inverse_scale);
}
__device__ __forceinline__ float int8_scale(float amax) {
  return amax / 127.0f;
}

// A thread's 16-byte vector of codes: 4 words, kVecCols columns (32 at 4
// bits, 16 at 8), always inside one group (groups are multiples of 32).
template <int BITS>
struct Vec {
  static constexpr int kCodes = 32 / BITS;     // codes a word
  static constexpr int kVecCols = 4 * kCodes;  // columns a vector
};

// One quantized activation row, in the order the GEMV's lanes read it: for
// each 16-byte vector of codes (affine::Vec), kPlanes 16-byte planes of int8
// activations — plane p of every vector back to back, so a warp's loads of a
// plane are one contiguous span — then a float2 (d, d · Σ q) per vector.
// 4 bits: a word's codes are read as its even nibbles (columns 0, 2, 4, 6)
// and its odd ones (1, 3, 5, 7), so word k's 8 bytes of activations are
// those columns' q in that order, words 0-1 in plane 0 and 2-3 in plane 1.
// 8 bits: a word's bytes are columns 0-3 in order, one plane.
template <int BITS>
struct Acts {
  static constexpr int kVecCols = affine::Vec<BITS>::kVecCols;
  static constexpr int kPlanes = kVecCols / 16;
  __host__ __device__ static int vecs(int cols) { return cols / kVecCols; }
  __host__ __device__ static size_t meta_at(int cols) {
    return size_t(kPlanes) * 16 * size_t(vecs(cols));
  }
  // Bytes of one row, a multiple of 16.
  __host__ __device__ static size_t row_bytes(int cols) {
    return (meta_at(cols) + 8 * size_t(vecs(cols)) + 15) / 16 * 16;
  }
};

// The int8 GEMM's activation layout (gemm_affine_mma.cu): Acts<4>'s bytes
// rearranged for a warp's mma operands. For each block v of 32 columns,
// `tokens` rows (n rounded up to 8; the pad rows are zeros) of 32 bytes back
// to back — word k's 8 bytes at 8k, its even columns' q then its odd ones',
// as in Acts<4> — then a float2 (d, d · Σ q) per (v, token) in the same
// order. A warp's B operand of a block (8 tokens) is then 256 contiguous
// bytes and its (d, d · Σ q) 64, where Acts<4> rows spread them over 16
// and 8 cache lines.
struct MmaActs {
  __host__ __device__ static int tokens(int n) { return (n + 7) / 8 * 8; }
  __host__ __device__ static size_t meta_at(int cols, int tokens) {
    return size_t(cols / 32) * size_t(tokens) * 32;
  }
  __host__ __device__ static size_t bytes(int cols, int tokens) {
    return size_t(cols / 32) * size_t(tokens) * 40;
  }
};

inline int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// Fails, naming `what`, unless the kernels take `w`: 4 or 8 bits, groups of
// 32, 64 or 128 columns, codes 16-byte aligned.
inline void check(const AffineMatrix& w, const char* what) {
  const bool aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if ((w.bits != 4 && w.bits != 8) || (w.group != 32 && w.group != 64 && w.group != 128) ||
      w.cols % w.group != 0 || !aligned)
    fail(
        "%s: affine weights of %d bits, group %d, %lld columns (codes 16-byte aligned: %s) are "
        "not supported",
        what, w.bits, w.group, (long long)w.cols, aligned ? "yes" : "no");
}

}  // namespace tandem::cuda::affine

namespace tandem::cuda {

// gemm_affine_mma.cu: the int8 tensor-core GEMM over activations quantized
// in the MmaActs layout for MmaActs::tokens(n) tokens; the caller has
// checked affine_mma_takes(w, n).
void launch_affine_mma(const AffineMatrix& w, const uint8_t* acts, int64_t n, float* y,
                       cudaStream_t stream);

}  // namespace tandem::cuda
