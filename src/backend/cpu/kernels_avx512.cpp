// AVX-512 (F/BW/VL/DQ) kernels: 16 f32 lanes, masked loads for every tail.
// Compiled with -mavx512*; see kernels_impl.h for the rules this file keeps
// (anonymous namespace, no shared inline/template helpers).
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "backend/cpu/kernels_impl.h"

// GCC 12's AVX-512 headers build vectors from _mm512_undefined_*() and trip
// -W(maybe-)uninitialized at every use (GCC PR 105593); the values are dead.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Lanes [0, n) of a 16-lane mask, n >= 0 (n >= 16 gives all lanes).
inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

template <DType D>
using WeightT = std::conditional_t<D == DType::F32, float, uint16_t>;

// 16 weights at p, widened to f32. bf16 -> f32 is a 16-bit left shift.
template <DType D>
inline __m512 load_w(const WeightT<D>* p) {
  if constexpr (D == DType::F32) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (D == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// As load_w for the lanes in m; the other lanes are 0 and their memory is not
// touched (masked loads do not fault past the end of a buffer).
template <DType D>
inline __m512 load_w_masked(const WeightT<D>* p, __mmask16 m) {
  if constexpr (D == DType::F32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (D == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// ---- Streaming kernel (decode GEMV, n <= kStreamMaxN) ---------------------
// Memory-bound: the goal is to keep the core's outstanding-miss slots busy
// with weight lines. Measured on the 2-core EPYC (bench/gemv.cpp): streaming
// R adjacent rows at once (R streams 2-16 KiB apart) is the slowest pattern
// (40-60% of peak, likely DRAM bank conflicts and per-page prefetch
// training); one row at a time is fast for short rows but loses ~30% on long
// rows (cols >= 6912), where x (27-32 KiB) is evicted from L1 and re-read per
// row. S streams far apart - rows k, k + h, k + 2h, k + 3h of the band - give
// both: sequential streams and x reused S times from one load. Software
// prefetch (256 B - 2 KiB ahead, T0/T1/T2/NTA hints) gave no consistent gain
// over the hardware prefetchers on this pattern, so there is none.

// out[j * S + i] = dot(x row j, W row i) for S weight rows at p[i] and T
// activation rows at x + j * cols. T == 1 keeps two accumulators per row so
// that enough FMA chains are in flight.
template <DType D, int S, int T>
inline void stream_rows(const float* x, const WeightT<D>* const* p, int64_t cols, float* out) {
  constexpr int A = T == 1 ? 2 : 1;  // accumulators per (row, activation)
  __m512 acc[A][S][T];
  for (int a = 0; a < A; ++a)
    for (int i = 0; i < S; ++i)
      for (int j = 0; j < T; ++j) acc[a][i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 * A <= cols; c += 16 * A) {
    for (int a = 0; a < A; ++a) {
      __m512 wv[S];
      for (int i = 0; i < S; ++i) wv[i] = load_w<D>(p[i] + c + 16 * a);
      for (int j = 0; j < T; ++j) {
        const __m512 xv = _mm512_loadu_ps(x + j * cols + c + 16 * a);
        for (int i = 0; i < S; ++i) acc[a][i][j] = _mm512_fmadd_ps(wv[i], xv, acc[a][i][j]);
      }
    }
  }
  for (; c < cols; c += 16) {
    const __mmask16 m = tail_mask(cols - c);
    __m512 wv[S];
    for (int i = 0; i < S; ++i) wv[i] = load_w_masked<D>(p[i] + c, m);
    for (int j = 0; j < T; ++j) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + j * cols + c);
      for (int i = 0; i < S; ++i) acc[0][i][j] = _mm512_fmadd_ps(wv[i], xv, acc[0][i][j]);
    }
  }
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < T; ++j) {
      __m512 v = acc[0][i][j];
      if constexpr (A == 2) v = _mm512_add_ps(v, acc[1][i][j]);
      out[j * S + i] = _mm512_reduce_add_ps(v);
    }
}

constexpr int kStreams = 4;  // far-apart weight rows streamed at once
constexpr int kStreamT = 4;  // activation rows per pass over the S rows

// The S rows at p against all n activation rows, kStreamT at a time (the
// rows are re-read from L1/L2 for the later groups, not from memory).
template <DType D, int S>
inline void stream_block(const float* x, int64_t n, const WeightT<D>* const* p, const int64_t* r,
                         const WeightMatrix& w, const float* bias, float* y) {
  float out[S * kStreamT];
  for (int64_t t = 0; t < n; t += kStreamT) {
    const int64_t tn = n - t < kStreamT ? n - t : kStreamT;
    const float* xt = x + t * w.cols;
    switch (tn) {
      case 1: stream_rows<D, S, 1>(xt, p, w.cols, out); break;
      case 2: stream_rows<D, S, 2>(xt, p, w.cols, out); break;
      case 3: stream_rows<D, S, 3>(xt, p, w.cols, out); break;
      default: stream_rows<D, S, kStreamT>(xt, p, w.cols, out); break;
    }
    for (int64_t j = 0; j < tn; ++j)
      for (int i = 0; i < S; ++i)
        y[(t + j) * w.rows + r[i]] = out[j * S + i] + (bias ? bias[r[i]] : 0.0f);
  }
}

// ---- GEMM (n > kStreamMaxN) -------------------------------------------------
// Blocking: the k dimension in blocks of kKc; activations in tiles of kTn
// rows (kTn x kKc f32 = 256 KiB, L2-resident while all W rows of the chunk go
// by); W in blocks of kMr rows converted once per (k block, x tile) into an
// f32 buffer (kMr x kKc f32 = 16 KiB, L1-resident), F32 weights used in
// place. The micro-kernel forms kMr x kMt dot products at once: per 16-lane
// step, kMr + kMt loads feed kMr * kMt FMAs.

constexpr int64_t kKc = 1024;
constexpr int64_t kTn = 64;
constexpr int kMr = 4;
constexpr int kMt = 6;

// dst[0, len) = W row segment as f32; len <= kKc.
template <DType D>
inline void convert_row(const WeightT<D>* src, int64_t len, float* dst) {
  int64_t c = 0;
  for (; c + 16 <= len; c += 16) _mm512_storeu_ps(dst + c, load_w<D>(src + c));
  if (c < len) {
    const __mmask16 m = tail_mask(len - c);
    _mm512_mask_storeu_ps(dst + c, m, load_w_masked<D>(src + c, m));
  }
}

// sums[i][j] = sum_{c < len} w[i * ldw + c] * x[j * ldx + c]
template <int R, int T>
inline void micro(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t len,
                  float sums[R][T]) {
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= len; c += 16) {
    __m512 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm512_loadu_ps(w + i * ldw + c);
    for (int j = 0; j < T; ++j) {
      const __m512 xv = _mm512_loadu_ps(x + j * ldx + c);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  if (c < len) {
    const __mmask16 m = tail_mask(len - c);
    __m512 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm512_maskz_loadu_ps(m, w + i * ldw + c);
    for (int j = 0; j < T; ++j) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + j * ldx + c);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

// Where one micro-tile's operands and results are.
#include "backend/cpu/kernels_isa_driver.inc"

// ---- Vector helpers ---------------------------------------------------------

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j)
      acc[j] =
          _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16 * j), _mm512_loadu_ps(b + i + 16 * j), acc[j]);
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    acc[0] =
        _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc[0]);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 r =
        _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

}  // namespace

const IsaKernels kAvx512Kernels = {"avx512", stream, gemm, dot, axpy};

}  // namespace tandem::cpu::detail
