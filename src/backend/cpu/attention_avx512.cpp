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

// kernels.h's attention_tile at head dim DIM. The scratch holds, as rows
// of 16 lanes (a lane a query row): qt[d] the queries times scale, ot[d]
// the outputs so far (unnormalized), pt[j] block key j's probabilities. A
// block: scores s[j] of its 16 keys for all rows (for 8 keys at a time, DIM
// steps of a query vector times each key's broadcast value), masked to each
// row's positions, then the online softmax — running max mx, sum l, ot
// scaled by e^(old max - new max) — and ot += Σ_j v[j] ⊗ pt[j] over the keys
// [j0, j1) alone (values past them may hold anything).
template <int DIM>
void tile_of(const TileRows& r, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
             float scale, float* scratch) {
  constexpr int R = kTileRows, KG = 8;  // keys scored together
  float* qt = scratch;
  float* ot = qt + DIM * R;
  float* pt = ot + DIM * R;
  for (int d = 0; d < DIM; ++d)
    for (int m = 0; m < R; ++m) qt[d * R + m] = m < r.count ? r.q[m][d] * scale : 0.0f;
  for (int d = 0; d < DIM; ++d) _mm512_storeu_ps(ot + d * R, _mm512_setzero_ps());
  // Rows past count attend nothing (first > last).
  const __mmask16 used = tail_mask(r.count);
  const __m512i first = _mm512_mask_loadu_epi32(_mm512_set1_epi32(1), used, r.first);
  const __m512i last = _mm512_mask_loadu_epi32(_mm512_setzero_si512(), used, r.last);
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 mx = neg_inf, l = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const KeyBlock& kb = blocks[b];
    __m512 s[R];
    for (int j0 = 0; j0 < R; j0 += KG) {
      const float* k[KG];
      for (int u = 0; u < KG; ++u) k[u] = kb.k + (j0 + u) * stride;
      __m512 acc[KG];
      for (int u = 0; u < KG; ++u) acc[u] = _mm512_setzero_ps();
      for (int d = 0; d < DIM; ++d) {
        const __m512 qv = _mm512_loadu_ps(qt + d * R);
        for (int u = 0; u < KG; ++u) acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(k[u][d]), qv, acc[u]);
      }
      for (int u = 0; u < KG; ++u) s[j0 + u] = acc[u];
    }
    __mmask16 valid[R];
    __m512 top = mx;
    for (int j = 0; j < R; ++j) {
      const __m512i pos = _mm512_set1_epi32(kb.pos + j);
      valid[j] =
          j >= kb.j0 && j < kb.j1
              ? __mmask16(_mm512_cmple_epi32_mask(first, pos) & _mm512_cmple_epi32_mask(pos, last))
              : __mmask16(0);
      s[j] = _mm512_mask_mov_ps(neg_inf, valid[j], s[j]);
      top = _mm512_max_ps(top, s[j]);
    }
    // Rows that have seen no key yet keep max -inf: shift by 0 there, so
    // that their e^(s - max) are e^-inf = 0, not NaN.
    const __m512 shift =
        _mm512_mask_mov_ps(top, _mm512_cmp_ps_mask(top, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
    const __m512 alpha = exp512(_mm512_sub_ps(mx, shift));
    l = _mm512_mul_ps(l, alpha);
    for (int j = kb.j0; j < kb.j1; ++j) {
      const __m512 p = _mm512_maskz_mov_ps(valid[j], exp512(_mm512_sub_ps(s[j], shift)));
      l = _mm512_add_ps(l, p);
      _mm512_storeu_ps(pt + j * R, p);
    }
    mx = top;
    for (int d0 = 0; d0 < DIM; d0 += 8) {
      __m512 o[8];
      for (int i = 0; i < 8; ++i) o[i] = _mm512_mul_ps(_mm512_loadu_ps(ot + (d0 + i) * R), alpha);
      const float* v = kb.v + kb.j0 * stride + d0;
      for (int j = kb.j0; j < kb.j1; ++j, v += stride) {
        const __m512 p = _mm512_loadu_ps(pt + j * R);
        for (int i = 0; i < 8; ++i) o[i] = _mm512_fmadd_ps(_mm512_set1_ps(v[i]), p, o[i]);
      }
      for (int i = 0; i < 8; ++i) _mm512_storeu_ps(ot + (d0 + i) * R, o[i]);
    }
  }
  float inv[R];
  _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l));
  for (int m = 0; m < r.count; ++m)
    for (int d = 0; d < DIM; ++d) r.out[m][d] = ot[d * R + m] * inv[m];
}

#include "backend/cpu/attention_tile_dims.inc"

}  // namespace

const AttentionKernels kAvx512Attention = {scores, values, exp_sum, tile};

}  // namespace tandem::cpu::detail
