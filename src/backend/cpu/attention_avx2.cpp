// AVX2 prefill attention tiles (kernels.h's attention_tile): the method of
// attention_avx512.cpp's tile_of with 8 lanes, so a tile's 16 query rows go
// as two halves of 8, each scoring every KV block once for its rows; masks
// are compare results blended in, the exponential exp256. The rest of the
// attention (decode steps) keeps the scalar kernels on AVX2.
// kernels_impl.h's rules hold: anonymous namespace, no shared inline helpers.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

namespace tandem::cpu::detail {
namespace {

#include "backend/cpu/exp256.inc"

// Rows [m0, m0 + 8) of the tile at head dim DIM. Scratch, as rows of 8
// lanes (a lane a query row): qt[d] the queries times scale, ot[d] the
// unnormalized outputs, pt[j] block key j's probabilities.
template <int DIM>
void half_of(const TileRows& r, int m0, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
             float scale, float* scratch) {
  constexpr int L = 8, KG = 8, R = kTileRows;  // lanes; keys scored together; keys a block
  float* qt = scratch;
  float* ot = qt + DIM * L;
  float* pt = ot + DIM * L;
  const int count = r.count - m0 < L ? r.count - m0 : L;
  for (int d = 0; d < DIM; ++d)
    for (int m = 0; m < L; ++m) qt[d * L + m] = m < count ? r.q[m0 + m][d] * scale : 0.0f;
  for (int d = 0; d < DIM; ++d) _mm256_storeu_ps(ot + d * L, _mm256_setzero_ps());
  // Rows past count attend nothing (first > last).
  int32_t fs[L], ls[L];
  for (int m = 0; m < L; ++m) {
    fs[m] = m < count ? r.first[m0 + m] : 1;
    ls[m] = m < count ? r.last[m0 + m] : 0;
  }
  const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fs));
  const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ls));
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 mx = neg_inf, l = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const KeyBlock& kb = blocks[b];
    __m256 s[R];
    for (int j0 = 0; j0 < R; j0 += KG) {
      const float* k[KG];
      for (int u = 0; u < KG; ++u) k[u] = kb.k + (j0 + u) * stride;
      __m256 acc[KG];
      for (int u = 0; u < KG; ++u) acc[u] = _mm256_setzero_ps();
      for (int d = 0; d < DIM; ++d) {
        const __m256 qv = _mm256_loadu_ps(qt + d * L);
        for (int u = 0; u < KG; ++u)
          acc[u] = _mm256_fmadd_ps(_mm256_broadcast_ss(k[u] + d), qv, acc[u]);
      }
      for (int u = 0; u < KG; ++u) s[j0 + u] = acc[u];
    }
    __m256 valid[R];
    __m256 top = mx;
    for (int j = 0; j < R; ++j) {
      const __m256i pos = _mm256_set1_epi32(kb.pos + j);
      const __m256i out =
          _mm256_or_si256(_mm256_cmpgt_epi32(first, pos), _mm256_cmpgt_epi32(pos, last));
      valid[j] = j >= kb.j0 && j < kb.j1
                     ? _mm256_castsi256_ps(_mm256_xor_si256(out, _mm256_set1_epi32(-1)))
                     : _mm256_setzero_ps();
      s[j] = _mm256_blendv_ps(neg_inf, s[j], valid[j]);
      top = _mm256_max_ps(top, s[j]);
    }
    // Rows that have seen no key yet keep max -inf: shift by 0 there.
    const __m256 shift =
        _mm256_blendv_ps(top, _mm256_setzero_ps(), _mm256_cmp_ps(top, neg_inf, _CMP_EQ_OQ));
    const __m256 alpha = exp256(_mm256_sub_ps(mx, shift));
    l = _mm256_mul_ps(l, alpha);
    for (int j = kb.j0; j < kb.j1; ++j) {
      const __m256 p = _mm256_and_ps(valid[j], exp256(_mm256_sub_ps(s[j], shift)));
      l = _mm256_add_ps(l, p);
      _mm256_storeu_ps(pt + j * L, p);
    }
    mx = top;
    for (int d0 = 0; d0 < DIM; d0 += 8) {
      __m256 o[8];
      for (int i = 0; i < 8; ++i) o[i] = _mm256_mul_ps(_mm256_loadu_ps(ot + (d0 + i) * L), alpha);
      const float* v = kb.v + kb.j0 * stride + d0;
      for (int j = kb.j0; j < kb.j1; ++j, v += stride) {
        const __m256 p = _mm256_loadu_ps(pt + j * L);
        for (int i = 0; i < 8; ++i) o[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(v + i), p, o[i]);
      }
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(ot + (d0 + i) * L, o[i]);
    }
  }
  float inv[L];
  _mm256_storeu_ps(inv, _mm256_div_ps(_mm256_set1_ps(1.0f), l));
  for (int m = 0; m < count; ++m)
    for (int d = 0; d < DIM; ++d) r.out[m0 + m][d] = ot[d * L + m] * inv[m];
}

template <int DIM>
void tile_of(const TileRows& r, const KeyBlock* blocks, int64_t nblocks, int64_t stride,
             float scale, float* scratch) {
  for (int m0 = 0; m0 < r.count; m0 += 8)
    half_of<DIM>(r, m0, blocks, nblocks, stride, scale, scratch);
}

#include "backend/cpu/attention_tile_dims.inc"

}  // namespace

// Only the tile: kernels.cpp keeps the scalar scores, values and exp_sum.
const AttentionKernels kAvx2Attention = {nullptr, nullptr, nullptr, tile};

}  // namespace tandem::cpu::detail
