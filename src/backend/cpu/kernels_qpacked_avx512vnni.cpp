// Quantized matmul over PackedAffine weights (core/tensor.h) with AVX-512
// VNNI, as outer products: one 64-byte vector of codes holds 4 bytes of each
// of 16 rows, so one vpdpbusd against 4 activation bytes broadcast to every
// lane adds 4 products to each of the 16 rows' sums. A token's sums of a
// block of 32 columns stay in one register (16 int32 rows) until the block's
// scales are applied, where the MLX-layout kernel (kernels_quant_avx512vnni.cpp)
// applies them after every two vpdpbusd. Same method and the same prepared
// activations as the scalar reference (kernels_quant.h, kernels_quant.cpp).
// Compiled with -mavx512f/bw/vl/dq -mavx512vnni; kernels_impl.h's rules hold.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_quant.h"

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

// The scalar reference's prepare, vectorized (the same bytes: products
// rounded to nearest even, block sums added in order).
void prepare(const float* x, const WeightMatrix& w, uint8_t* out) {
  const QuantActLayout L = quant_act_layout(w);
  const int64_t cols = w.cols, G = w.group_size;
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + L.d);
  auto* xs = reinterpret_cast<float*>(out + L.xs);
  for (int64_t g = 0; g < cols / G; ++g) xs[g] = 0.0f;
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * 32 + 16), _mm512_cvtepi32_epi8(q1));
    xs[b * 32 / G] += float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))) * d[b];
  }
}

// 16 scales (or biases) of type SD at p, as f32.
template <DType SD>
inline __m512 load16(const uint8_t* p) {
  if constexpr (SD == DType::F32) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (SD == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Four activation bytes at p in every lane (vpdpbusd's broadcast operand).
typedef int32_t __attribute__((may_alias, aligned(1))) unaligned_i32;
inline __m512i broadcast4(const int8_t* p) {
  return _mm512_set1_epi32(*reinterpret_cast<const unaligned_i32*>(p));
}

// Software prefetch distance in each weight stream of the decode tile (the
// MLX-layout kernel's measurement: the misses outlast the out-of-order window).
constexpr int64_t kPrefetch = 2048;

// acc[rv][t] = the 16 rows of block rv times prepared activation row t, over
// every column: for each block of 32 columns the int32 sums of 32 / V
// vectors, then acc += sums · (scale · d); for each group acc += bias · xs.
template <int BITS, DType SD, int RV, int T, bool PREFETCH>
inline void tile(const PackedPanels& w, int64_t cols, int64_t G, const uint8_t* const* act,
                 const QuantActLayout& L, __m512 (&acc)[RV][T]) {
  constexpr int64_t V = 32 / BITS;        // columns a vector covers
  constexpr int64_t kBlockVecs = 32 / V;  // vectors a block of 32 columns
  constexpr int64_t SB = SD == DType::F32 ? 4 : 2;
  const int64_t groups = cols / G, group_blocks = G / 32;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const int8_t* q[T];
  const float *d[T], *xs[T];
  for (int t = 0; t < T; ++t) {
    q[t] = reinterpret_cast<const int8_t*>(act[t]);
    d[t] = reinterpret_cast<const float*>(act[t] + L.d);
    xs[t] = reinterpret_cast<const float*>(act[t] + L.xs);
  }
#pragma GCC unroll 4
  for (int r = 0; r < RV; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const uint8_t* vec = w.codes;  // block 0's vector of the current columns
  for (int64_t g = 0; g < groups; ++g) {
    __m512 s[RV];
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) s[r] = load16<SD>(w.scales + r * w.sstride + g * 16 * SB);
    for (int64_t blk = g * group_blocks; blk < (g + 1) * group_blocks; ++blk) {
      __m512i sum[RV][T];
#pragma GCC unroll 4
      for (int r = 0; r < RV; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) sum[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int64_t v = 0; v < kBlockVecs; ++v, vec += 64) {
        const int64_t c = blk * 32 + v * V;
#pragma GCC unroll 4
        for (int r = 0; r < RV; ++r) {
          const uint8_t* p = vec + r * w.panel;
          if constexpr (PREFETCH)
            _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
          const __m512i codes = _mm512_loadu_si512(p);
          if constexpr (BITS == 4) {
            const __m512i lo = _mm512_and_si512(codes, nib);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), nib);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) {
              sum[r][t] = _mm512_dpbusd_epi32(sum[r][t], lo, broadcast4(q[t] + c));
              sum[r][t] = _mm512_dpbusd_epi32(sum[r][t], hi, broadcast4(q[t] + c + 4));
            }
          } else {
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t)
              sum[r][t] = _mm512_dpbusd_epi32(sum[r][t], codes, broadcast4(q[t] + c));
          }
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512 dt = _mm512_set1_ps(d[t][blk]);
#pragma GCC unroll 4
        for (int r = 0; r < RV; ++r)
          acc[r][t] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][t]), _mm512_mul_ps(s[r], dt), acc[r][t]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) {
      const __m512 b = load16<SD>(w.biases + r * w.sstride + g * 16 * SB);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t)
        acc[r][t] = _mm512_fmadd_ps(b, _mm512_set1_ps(xs[t][g]), acc[r][t]);
    }
  }
}

// Lanes [0, n) of a 16-lane mask (n <= 0: none, n >= 16: all).
inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Runs tile for blocks of 16 rows at r, r + ystride, ... (RV of them) and
// tokens t0 .. t0 + T - 1, writing y[t * rows + row] (+ bias) for rows < r1.
template <int BITS, DType SD, int RV, int T, bool PREFETCH>
inline void run_tile(const PackedPanels& p, const uint8_t* acts, int64_t t0,
                     const QuantActLayout& L, const WeightMatrix& w, int64_t r, int64_t ystride,
                     int64_t r1, const float* bias, float* y) {
  const uint8_t* act[T];
  for (int t = 0; t < T; ++t) act[t] = acts + (t0 + t) * L.total;
  __m512 acc[RV][T];
  tile<BITS, SD, RV, T, PREFETCH>(p, w.cols, w.group_size, act, L, acc);
#pragma GCC unroll 4
  for (int i = 0; i < RV; ++i) {
    const int64_t row = r + i * ystride;
    const __mmask16 m = mask16(r1 - row);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + row) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      _mm512_mask_storeu_ps(y + (t0 + t) * w.rows + row, m, _mm512_add_ps(acc[i][t], b));
  }
}

constexpr int kStreams = 4;     // decode: blocks far apart streamed at once (packed_driver.inc)
constexpr int kTileTokens = 8;  // prefill: activation rows a tile (one block of 16 rows)

#include "backend/cpu/qpacked_driver.inc"
#include "backend/cpu/quant_dispatch.inc"

}  // namespace

const QuantKernels kAvx512VnniPackedQuant = {"avx512-vnni-packed", act_bytes, prepare, compute};

}  // namespace tandem::cpu::detail
