// AVX2 + FMA + F16C kernels: 8 f32 lanes. AVX2 has no masked 16-bit loads,
// so weight tails go through a zero-padded stack copy; f32 tails use
// vmaskmovps, which does not fault on masked-off lanes. Compiled with -mavx2
// -mfma -mf16c; see kernels_impl.h for the rules this file keeps.
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "backend/cpu/kernels_impl.h"

namespace tandem::cpu::detail {
namespace {

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Loading 8 ints from kMaskTable + 8 - n gives n all-ones lanes, then zeros.
alignas(64) constexpr int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
inline __m256i tail_mask(int64_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - (n >= 8 ? 8 : n)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType D>
using WeightT = std::conditional_t<D == DType::F32, float, uint16_t>;

// 8 weights at p, widened to f32.
template <DType D>
inline __m256 load_w(const WeightT<D>* p) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (D == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// The first n (< 8) weights at p, widened to f32; the other lanes are 0.
template <DType D>
inline __m256 load_w_partial(const WeightT<D>* p, int64_t n) {
  if constexpr (D == DType::F32) {
    return _mm256_maskload_ps(p, tail_mask(n));
  } else {
    alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; ++i) tmp[i] = p[i];
    return load_w<D>(tmp);
  }
}

// ---- Streaming kernel (decode GEMV, n <= kStreamMaxN) ---------------------
// Same access pattern as the AVX-512 kernel (see there for the measurements):
// S = 4 weight rows far apart in the band streamed at once, x reused S times.

// out[j * S + i] = dot(x row j, W row i) for S weight rows at p[i] and T
// activation rows at x + j * cols.
template <DType D, int S, int T>
inline void stream_rows(const float* x, const WeightT<D>* const* p, int64_t cols, float* out) {
  constexpr int A = T == 1 ? 2 : 1;  // accumulators per (row, activation)
  __m256 acc[A][S][T];
  for (int a = 0; a < A; ++a)
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < T; ++j) acc[a][i][j] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 * A <= cols; c += 8 * A) {
    for (int a = 0; a < A; ++a) {
      __m256 wv[S];
      for (int i = 0; i < S; ++i) wv[i] = load_w<D>(p[i] + c + 8 * a);
      for (int j = 0; j < T; ++j) {
        const __m256 xv = _mm256_loadu_ps(x + j * cols + c + 8 * a);
        for (int i = 0; i < S; ++i) acc[a][i][j] = _mm256_fmadd_ps(wv[i], xv, acc[a][i][j]);
      }
    }
  }
  for (; c < cols; c += 8) {
    const int64_t len = cols - c;
    const __m256i m = tail_mask(len);
    __m256 wv[S];
    for (int i = 0; i < S; ++i)
      wv[i] = len >= 8 ? load_w<D>(p[i] + c) : load_w_partial<D>(p[i] + c, len);
    for (int j = 0; j < T; ++j) {
      const __m256 xv = _mm256_maskload_ps(x + j * cols + c, m);
      for (int i = 0; i < S; ++i) acc[0][i][j] = _mm256_fmadd_ps(wv[i], xv, acc[0][i][j]);
    }
  }
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < T; ++j) {
      __m256 v = acc[0][i][j];
      if constexpr (A == 2) v = _mm256_add_ps(v, acc[1][i][j]);
      out[j * S + i] = hsum(v);
    }
}

constexpr int kStreams = 4;  // far-apart weight rows streamed at once
constexpr int kStreamT = 2;  // activation rows per pass (4 x 2 accumulators fit 16 registers)

template <DType D, int S>
inline void stream_block(const float* x, int64_t n, const WeightT<D>* const* p, const int64_t* r,
                         const WeightMatrix& w, const float* bias, float* y) {
  float out[S * kStreamT];
  for (int64_t t = 0; t < n; t += kStreamT) {
    const int64_t tn = n - t < kStreamT ? n - t : kStreamT;
    const float* xt = x + t * w.cols;
    if (tn == 1)
      stream_rows<D, S, 1>(xt, p, w.cols, out);
    else
      stream_rows<D, S, kStreamT>(xt, p, w.cols, out);
    for (int64_t j = 0; j < tn; ++j)
      for (int i = 0; i < S; ++i)
        y[(t + j) * w.rows + r[i]] = out[j * S + i] + (bias ? bias[r[i]] : 0.0f);
  }
}

// ---- GEMM (n > kStreamMaxN) -------------------------------------------------
// Same blocking as the AVX-512 kernel (see there), with a 4 x 3 micro-tile:
// 12 accumulators + 4 weight vectors fill the 16 ymm registers, so x enters
// the FMAs as memory operands (L1 hits).

constexpr int64_t kKc = 1024;
constexpr int64_t kTn = 64;
constexpr int kMr = 4;
constexpr int kMt = 3;

template <DType D>
inline void convert_row(const WeightT<D>* src, int64_t len, float* dst) {
  int64_t c = 0;
  for (; c + 8 <= len; c += 8) _mm256_storeu_ps(dst + c, load_w<D>(src + c));
  if (c < len)
    _mm256_maskstore_ps(dst + c, tail_mask(len - c), load_w_partial<D>(src + c, len - c));
}

// sums[i][j] = sum_{c < len} w[i * ldw + c] * x[j * ldx + c]
template <int R, int T>
inline void micro(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t len,
                  float sums[R][T]) {
  __m256 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= len; c += 8) {
    __m256 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm256_loadu_ps(w + i * ldw + c);
    for (int j = 0; j < T; ++j) {
      const __m256 xv = _mm256_loadu_ps(x + j * ldx + c);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  if (c < len) {
    const __m256i m = tail_mask(len - c);
    __m256 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm256_maskload_ps(w + i * ldw + c, m);
    for (int j = 0; j < T; ++j) {
      const __m256 xv = _mm256_maskload_ps(x + j * ldx + c, m);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) sums[i][j] = hsum(acc[i][j]);
}

#include "backend/cpu/kernels_isa_driver.inc"

// ---- Vector helpers ---------------------------------------------------------

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] =
          _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (; i < n; i += 8) {
    const __m256i m = tail_mask(n - i);
    acc[0] = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc[0]);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    const __m256 r =
        _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
    _mm256_maskstore_ps(y + i, m, r);
  }
}

}  // namespace

const IsaKernels kAvx2Kernels = {"avx2", stream, gemm, dot, axpy};

}  // namespace tandem::cpu::detail
