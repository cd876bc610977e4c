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

// A thread's 16-byte vector of codes: 4 words, kVecCols columns (32 at 4
// bits, 16 at 8), always inside one group (groups are multiples of 32).
template <int BITS>
struct Vec {
  static constexpr int kCodes = 32 / BITS;     // codes a word
  static constexpr int kVecCols = 4 * kCodes;  // columns a vector
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
