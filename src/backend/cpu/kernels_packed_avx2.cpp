// Matmuls over WeightFormat::PackedBf16 weights with AVX2 + FMA, for
// processors without AVX-512 BF16: each 64-byte vector of 16 rows is read as
// two 32-byte halves of 8 rows, widened exactly to f32 (even columns by a
// shift, odd ones by a mask) and multiplied by the token's two broadcast
// values — the outer product of kernels_packed_avx512bf16.cpp on f32 FMAs.
// bf16 inputs arrive rounded to f32 values (kernels.cpp), so one kernel
// serves both lanes. Keeps kernels_impl.h's rules.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

namespace tandem::cpu::detail {
namespace {

// Blocking as the AVX-512 kernels: k blocks of kKc values (a panel of 16
// rows x 1,024 bf16 = 32 KiB), token tiles of kT; one row vector (two halves)
// a micro-tile: 4 tokens x 2 halves = 8 accumulators + 4 widened halves +
// 2 broadcasts of the 16 ymm registers.
constexpr int64_t kKc = 1024;
constexpr int kT = 4;
constexpr int kStreams = 4;  // decode: row vectors far apart, as the dense GEMV

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Lanes [0, n) of an 8-lane f32 mask for maskload/maskstore.
inline __m256i lanes(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int k = n <= 0 ? 0 : n >= 8 ? 8 : int(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), idx);
}

struct Tile {
  const uint16_t* w;  // row vector 0 at the block's first column pair
  int64_t vstride;    // elements between row vectors
  const float* x;     // token 0 at the block's first column
  int64_t ldx;
  int64_t pairs;
  float* y;  // y[t · ldy + ystride · v + i]
  int64_t ldy;
  int64_t ystride = 16;
  const float* bias;
  int64_t valid;  // rows from row 0 that exist
  bool first;
};

// T tokens against V row vectors (2V halves of 8 rows).
template <int T, int V>
inline void micro(const Tile& a) {
  __m256i m[2 * V];
  for (int h = 0; h < 2 * V; ++h) m[h] = lanes(a.valid - (h / 2) * a.ystride - 8 * (h % 2));
  __m256 acc[T][2 * V];
  for (int h = 0; h < 2 * V; ++h) {
    const int64_t off = (h / 2) * a.ystride + 8 * (h % 2);
    const __m256 b =
        a.first && a.bias ? _mm256_maskload_ps(a.bias + off, m[h]) : _mm256_setzero_ps();
    for (int t = 0; t < T; ++t)
      acc[t][h] = a.first ? b : _mm256_maskload_ps(a.y + t * a.ldy + off, m[h]);
  }
  const __m256i odd_mask = _mm256_set1_epi32(int(0xffff0000u));
  for (int64_t p = 0; p < a.pairs; ++p) {
    __m256 even[2 * V], odd[2 * V];
    for (int h = 0; h < 2 * V; ++h) {
      const __m256i w = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.w + (h / 2) * a.vstride + p * 32 + 16 * (h % 2)));
      even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      odd[h] = _mm256_castsi256_ps(_mm256_and_si256(w, odd_mask));
    }
    for (int t = 0; t < T; ++t) {
      const __m256 x0 = _mm256_set1_ps(a.x[t * a.ldx + 2 * p]);
      const __m256 x1 = _mm256_set1_ps(a.x[t * a.ldx + 2 * p + 1]);
      for (int h = 0; h < 2 * V; ++h) {
        acc[t][h] = _mm256_fmadd_ps(even[h], x0, acc[t][h]);
        acc[t][h] = _mm256_fmadd_ps(odd[h], x1, acc[t][h]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 2 * V; ++h)
      _mm256_maskstore_ps(a.y + t * a.ldy + (h / 2) * a.ystride + 8 * (h % 2), m[h], acc[t][h]);
}

template <int V, int T = 1>
inline void micro_tokens(const Tile& a, int64_t tokens) {
  if constexpr (T < kT) {
    if (tokens != T) return micro_tokens<V, T + 1>(a, tokens);
  }
  micro<T, V>(a);
}

void decode_tile(const Tile& a, int64_t tokens);
void decode_rest(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1);
#include "backend/cpu/packed_driver.inc"

// Rows [r0, r1) (r0 a multiple of 16): k blocks, row vectors, token tiles.
void packed_matmul(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                   int64_t r0, int64_t r1) {
  const int64_t cols = w.cols, rows = w.rows;
  const int64_t kc_max = n <= kT ? cols : kKc;
  for (int64_t k0 = 0; k0 < cols || k0 == 0; k0 += kc_max) {
    const int64_t kc = min64(kc_max, cols - k0);
    for (int64_t r = r0; r < r1; r += 16) {
      Tile a = panel_tile(w, r, k0, kc, bias, r1);
      for (int64_t t = 0; t < n; t += kT) {
        a.x = x + t * cols + k0;
        a.y = y + t * rows + r;
        micro_tokens<1>(a, min64(kT, n - t));
      }
    }
    if (cols == 0) break;
  }
}

void decode_tile(const Tile& a, int64_t tokens) {
  if (tokens == 1)
    micro<1, kStreams>(a);
  else
    micro<2, kStreams>(a);
}

void decode_rest(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1) {
  packed_matmul(x, n, w, bias, y, r0, r1);
}

void matmul_f32(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                int64_t r0, int64_t r1) {
  if (n <= 2) return packed_decode(x, n, w, bias, y, r0, r1);
  packed_matmul(x, n, w, bias, y, r0, r1);
}

}  // namespace

// No pack (the portable loop packs, once, at load) and no bf16-input
// kernel (kernels.cpp rounds x to f32 values for matmul_f32 instead).
const PackedKernels kAvx2PackedKernels = {nullptr, matmul_f32, nullptr};

}  // namespace tandem::cpu::detail
