// The prefill GEMM over bf16 weights with bf16 activations (AVX-512 BF16:
// vdpbf16ps, two bf16 products a lane summed into f32). Compiled with
// -mavx512bf16 and dispatched only where cpuid reports it; keeps
// kernels_impl.h's rules (anonymous namespace, no shared inline helpers).
//
// The products of two bf16 values are exact in f32, so the result is the f32
// sum of bf16(x) · w — what the f32 GEMM computes on activations rounded to
// bf16 — up to the order of the additions. On this 2-core EPYC vdpbf16ps
// retires 32 products a lane-pair per instruction against the f32 FMA's 16
// (435 against 227 GFLOP/s a core, measured), and the weights are read in
// place instead of being widened to f32 per activation tile.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

// Blocking: k in blocks of kKc values, activations in tiles of kTn rows
// (kTn x kKc bf16 = 256 KiB, L2-resident while the weight rows of a thread's
// band go by); kMr weight rows (kMr x kKc bf16 = 24 KiB, L1-resident) against
// kMt activation rows per micro-tile: per 32 values, kMr + kMt loads feed
// kMr * kMt dot products. A longer kKc than the f32 GEMM's halves the cost
// of the micro-tile's horizontal sums per product. Measured with
// bench/gemv.cpp (n = 64, one thread, GFLOP/s at llama-3.2-1b's and
// gemma-3-1b's shapes): 6 x 4 tiles 300-345, 5 x 5 300-315, 4 x 6 255-300,
// 8 x 3 240-280, 3 x 8 195-225.
constexpr int64_t kKc = 2048;
constexpr int64_t kTn = 64;
constexpr int kMr = 6;
constexpr int kMt = 4;

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Values [0, n) of a 32-value mask, n >= 0 (n >= 32 gives all).
inline __mmask32 tail_mask32(int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << n) - 1);
}

inline __m512bh load_bf16(const uint16_t* p) {
  return __m512bh(_mm512_loadu_si512(p));
}

inline __m512bh load_bf16_masked(const uint16_t* p, __mmask32 m) {
  return __m512bh(_mm512_maskz_loadu_epi16(m, p));
}

#include "backend/cpu/lane_sums_avx512.inc"

// sums[i][j] = Σ_{c < len} w[i * ldw + c] · x[j * ldx + c] (masked loads
// for the tail: the lanes past len are zero and their memory is not read).
template <int R, int T>
inline void micro(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t ldx, int64_t len,
                  float sums[R][T]) {
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= len; c += 32) {
    __m512bh wv[R];
    for (int i = 0; i < R; ++i) wv[i] = load_bf16(w + i * ldw + c);
    for (int j = 0; j < T; ++j) {
      const __m512bh xv = load_bf16(x + j * ldx + c);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[i], xv);
    }
  }
  if (c < len) {
    const __mmask32 m = tail_mask32(len - c);
    __m512bh wv[R];
    for (int i = 0; i < R; ++i) wv[i] = load_bf16_masked(w + i * ldw + c, m);
    for (int j = 0; j < T; ++j) {
      const __m512bh xv = load_bf16_masked(x + j * ldx + c, m);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[i], xv);
    }
  }
  for (int i = 0; i < R; ++i) {
    if constexpr (T == 4) {
      _mm_storeu_ps(sums[i], lane_sums4(acc[i]));
    } else {
      for (int j = 0; j < T; ++j) sums[i][j] = _mm512_reduce_add_ps(acc[i][j]);
    }
  }
}

#include "backend/cpu/kernels_tile.inc"

// The last rb (< kMr) weight rows of a band.
template <int R = 1>
inline void rows_rest(const TileArgs<uint16_t>& a, int64_t tn, int rb) {
  if constexpr (R < kMr) {
    if (rb == R) return row_block<R>(a, tn);
    rows_rest<R + 1>(a, tn, rb);
  }
}

void gemm_bf16(const uint16_t* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
               int64_t r0, int64_t r1) {
  const auto* W = static_cast<const uint16_t*>(w.data);
  const int64_t cols = w.cols, rows = w.rows;
  if (cols == 0) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = r0; r < r1; ++r) y[t * rows + r] = bias ? bias[r] : 0.0f;
    return;
  }
  for (int64_t k0 = 0; k0 < cols; k0 += kKc) {
    const int64_t kc = min64(kKc, cols - k0);
    for (int64_t t0 = 0; t0 < n; t0 += kTn) {
      const int64_t tn = min64(kTn, n - t0);
      for (int64_t r = r0; r < r1;) {
        const int rb = int(min64(kMr, r1 - r));
        TileArgs<uint16_t> a;
        a.w = W + r * cols + k0;
        a.ldw = cols;
        a.x = x + t0 * cols + k0;
        a.ldx = cols;
        a.len = kc;
        a.y = y + t0 * rows + r;
        a.ldy = rows;
        a.bias = bias ? bias + r : nullptr;
        a.first = k0 == 0;
        if (rb == kMr)
          row_block<kMr>(a, tn);
        else
          rows_rest(a, tn, rb);
        r += rb;
      }
    }
  }
}

void round_bf16(const float* x, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        __m256i(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i))));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(dst + i, m,
                             __m256i(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i))));
  }
}

}  // namespace

const Bf16Kernels kAvx512Bf16Kernels = {round_bf16, gemm_bf16};

}  // namespace tandem::cpu::detail
