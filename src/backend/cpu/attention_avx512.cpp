// AVX-512 building blocks of the CPU attention (ops.cpp): q·k scores of a
// few query heads against a run of keys, the probability-weighted sum of
// value rows, and exp. Up to four query heads (one kv head's group, or part
// of it) share every key and value row they load. kernels_impl.h's rules
// hold: anonymous namespace, no shared inline helpers.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

constexpr int kHeads = 4;  // query heads a pass takes together
constexpr int kKeys = 4;   // keys a score micro-tile takes together

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

#include "backend/cpu/lane_sums_avx512.inc"

// Scores of G query heads: kKeys keys at a time (their rows loaded once for
// all G heads), then one at a time.
template <int G>
void scores_of(const float* q, int64_t q_stride, const float* k, int64_t k_stride, int64_t nk,
               int64_t dim, float scale, float* s, int64_t s_stride) {
  const __m128 scale4 = _mm_set1_ps(scale);
  int64_t j = 0;
  for (; j + kKeys <= nk; j += kKeys) {
    __m512 acc[G][kKeys];
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < kKeys; ++u) acc[g][u] = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = tail_mask(dim - c);
      __m512 kv[kKeys];
      for (int u = 0; u < kKeys; ++u) kv[u] = _mm512_maskz_loadu_ps(m, k + (j + u) * k_stride + c);
      for (int g = 0; g < G; ++g) {
        const __m512 qv = _mm512_maskz_loadu_ps(m, q + g * q_stride + c);
        for (int u = 0; u < kKeys; ++u) acc[g][u] = _mm512_fmadd_ps(qv, kv[u], acc[g][u]);
      }
    }
    for (int g = 0; g < G; ++g)
      _mm_storeu_ps(s + g * s_stride + j, _mm_mul_ps(lane_sums4(acc[g]), scale4));
  }
  for (; j < nk; ++j) {
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = tail_mask(dim - c);
      const __m512 kv = _mm512_maskz_loadu_ps(m, k + j * k_stride + c);
      for (int g = 0; g < G; ++g)
        acc[g] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * q_stride + c), kv, acc[g]);
    }
    for (int g = 0; g < G; ++g) s[g * s_stride + j] = _mm512_reduce_add_ps(acc[g]) * scale;
  }
}

void scores(const float* q, int nq, int64_t q_stride, const float* k, int64_t k_stride, int64_t nk,
            int64_t dim, float scale, float* s, int64_t s_stride) {
  for (int g0 = 0; g0 < nq; g0 += kHeads) {
    const float* qg = q + g0 * q_stride;
    float* sg = s + g0 * s_stride;
    switch (nq - g0 < kHeads ? nq - g0 : kHeads) {
      case 1: scores_of<1>(qg, q_stride, k, k_stride, nk, dim, scale, sg, s_stride); break;
      case 2: scores_of<2>(qg, q_stride, k, k_stride, nk, dim, scale, sg, s_stride); break;
      case 3: scores_of<3>(qg, q_stride, k, k_stride, nk, dim, scale, sg, s_stride); break;
      default: scores_of<4>(qg, q_stride, k, k_stride, nk, dim, scale, sg, s_stride); break;
    }
  }
}

// out_g += Σ_j p_g[j] · v_j for G heads over 64 columns of the rows at a
// time: the G x 4 accumulators stay in registers across all nk value rows,
// each row loaded once.
template <int G>
void values_of(const float* p, int64_t p_stride, const float* v, int64_t v_stride, int64_t nk,
               int64_t dim, float* out, int64_t out_stride) {
  for (int64_t c0 = 0; c0 < dim; c0 += 64) {
    __mmask16 m[4];
    for (int u = 0; u < 4; ++u) m[u] = c0 + 16 * u < dim ? tail_mask(dim - c0 - 16 * u) : 0;
    __m512 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < 4; ++u)
        acc[g][u] = _mm512_maskz_loadu_ps(m[u], out + g * out_stride + c0 + 16 * u);
    for (int64_t j = 0; j < nk; ++j) {
      __m512 vv[4];
      for (int u = 0; u < 4; ++u)
        vv[u] = _mm512_maskz_loadu_ps(m[u], v + j * v_stride + c0 + 16 * u);
      for (int g = 0; g < G; ++g) {
        const __m512 pg = _mm512_set1_ps(p[g * p_stride + j]);
        for (int u = 0; u < 4; ++u) acc[g][u] = _mm512_fmadd_ps(pg, vv[u], acc[g][u]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < 4; ++u)
        _mm512_mask_storeu_ps(out + g * out_stride + c0 + 16 * u, m[u], acc[g][u]);
  }
}

void values(const float* p, int nq, int64_t p_stride, const float* v, int64_t v_stride, int64_t nk,
            int64_t dim, float* out, int64_t out_stride) {
  for (int g0 = 0; g0 < nq; g0 += kHeads) {
    const float* pg = p + g0 * p_stride;
    float* og = out + g0 * out_stride;
    switch (nq - g0 < kHeads ? nq - g0 : kHeads) {
      case 1: values_of<1>(pg, p_stride, v, v_stride, nk, dim, og, out_stride); break;
      case 2: values_of<2>(pg, p_stride, v, v_stride, nk, dim, og, out_stride); break;
      case 3: values_of<3>(pg, p_stride, v, v_stride, nk, dim, og, out_stride); break;
      default: values_of<4>(pg, p_stride, v, v_stride, nk, dim, og, out_stride); break;
    }
  }
}

#include "backend/cpu/exp512.inc"

float exp_sum(float* x, int64_t n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), sh));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace

const AttentionKernels kAvx512Attention = {scores, values, exp_sum};

}  // namespace tandem::cpu::detail
