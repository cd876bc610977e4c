// Quantized matmul with AVX-512 VNNI (vpdpbusd on 512-bit vectors): 64 u8×s8
// products per instruction. Compiled with -mavx512f/bw/vl/dq -mavx512vnni;
// see kernels_quant.h for the method and kernels_impl.h for the rules this
// file keeps.
//
// A chunk is one 64-byte load of codes: 128 values at 4 bits, 64 at 8 bits.
// vpdpbusd sums 4 adjacent bytes into each of 16 int32 lanes, so lane k of a
// chunk covers values 8k..8k+7 (4-bit: low nibbles = even values, high =
// odd, each against the matching half of the activations) or 4k..4k+3
// (8-bit). Each lane is then scaled in f32 by its group's weight scale times
// its block's activation scale, both broadcast to lanes by vpermps.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_quant.h"

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

inline int64_t align64(int64_t n) {
  return (n + 63) & ~int64_t(63);
}

inline int64_t dsize(DType t) {
  return t == DType::F32 ? 4 : 2;
}

// WeightMatrix's inline helpers are not called here (kernels_impl.h's rule).
inline int64_t groups_of(const WeightMatrix& w) {
  return w.cols / w.group_size;
}
inline int64_t row_bytes_of(const WeightMatrix& w) {
  return w.cols * w.bits / 8;
}

// Prepared activation row: codes [nch · cv] int8 (4-bit: per chunk the 64
// even values, then the 64 odd ones; 8-bit: in order) | lane scales [nch ·
// 16] f32 (the block scale of each vpdpbusd lane) | sums of the quantized
// activations per weight group [groups rounded up to 16] f32.
struct Layout {
  int64_t cv;     // values per chunk
  int64_t nch;    // chunks, the last one possibly partial
  int64_t lanes;  // byte offset of the lane scales
  int64_t sums;   // byte offset of the group sums
  int64_t total;
};

inline Layout layout(const WeightMatrix& w) {
  Layout l;
  l.cv = w.bits == 4 ? 128 : 64;
  l.nch = (w.cols + l.cv - 1) / l.cv;
  l.lanes = align64(l.nch * l.cv);
  l.sums = l.lanes + align64(l.nch * 16 * 4);
  l.total = l.sums + align64((groups_of(w) + 15) / 16 * 16 * 4);
  return l;
}

size_t act_bytes(const WeightMatrix& w) {
  return size_t(layout(w).total);
}

// Lanes [0, n) of a 16-lane mask (n <= 0: none, n >= 16: all).
inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

void prepare(const float* x, const WeightMatrix& w, uint8_t* out) {
  const Layout L = layout(w);
  const int64_t cols = w.cols, G = w.group_size;
  auto* codes = reinterpret_cast<int8_t*>(out);
  auto* lanes = reinterpret_cast<float*>(out + L.lanes);
  auto* sums = reinterpret_cast<float*>(out + L.sums);
  // Zero the padding of the last chunk (codes and lane scales) and of the sums.
  for (int64_t i = cols; i < L.nch * L.cv; ++i) codes[i] = 0;
  for (int64_t i = cols / 32; i < L.nch * L.cv / 32; ++i) {
    const int64_t per = L.cv == 128 ? 4 : 8;  // lanes per block
    const int64_t c = i / (L.cv / 32), first = (i % (L.cv / 32)) * per;
    for (int64_t k = 0; k < per; ++k) lanes[c * 16 + first + k] = 0.0f;
  }
  const int64_t groups = groups_of(w);
  for (int64_t g = 0; g < (groups + 15) / 16 * 16; ++g) sums[g] = 0.0f;

  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < cols / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * 32), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * 32 + 16), _mm512_cvtepi32_epi8(q1));
    sums[b * 32 / G] += float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1))) * d;
    if (L.cv == 128) {  // lanes 4(b%4) .. +3 of chunk b/4
      for (int k = 0; k < 4; ++k) lanes[(b / 4) * 16 + (b % 4) * 4 + k] = d;
    } else {  // lanes 8(b%2) .. +7 of chunk b/2
      for (int k = 0; k < 8; ++k) lanes[(b / 2) * 16 + (b % 2) * 8 + k] = d;
    }
  }
  if (L.cv == 128) {
    // Split each chunk into its even and odd values (bytes of 16-bit words).
    const __m512i lo_byte = _mm512_set1_epi16(0x00ff);
    for (int64_t c = 0; c < L.nch; ++c) {
      int8_t* p = codes + c * 128;
      const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
      const __m256i ea = _mm512_cvtepi16_epi8(_mm512_and_si512(a, lo_byte));
      const __m256i eb = _mm512_cvtepi16_epi8(_mm512_and_si512(b, lo_byte));
      const __m256i oa = _mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8));
      const __m256i ob = _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ea);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 32), eb);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 64), oa);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 96), ob);
    }
  }
}

// Up to 16 scales (or biases) of type SD from p, as f32; lanes outside m are 0.
template <DType SD>
inline __m512 load_sc(const void* p, __mmask16 m) {
  if constexpr (SD == DType::F32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (SD == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Software prefetch distance (bytes ahead in each weight stream). The codes
// need ~6x the instructions per byte of a bf16 GEMV, so the out-of-order
// window no longer covers the miss latency: measured on one gemma-3-1b
// token's matmuls with 2 threads (an idle 2-core Xeon slice, 4-bit), 0 B:
// 19-22 GB/s, 1 KiB: 22-24, 2 KiB: 26-28 GB/s (>= its membw figure).
constexpr int64_t kPrefetch = 2048;

// Horizontal sums of 4 vectors: {Σa, Σb, Σc, Σd} in the low 4 lanes.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Fold 512 -> 256 -> 128 bits, then transpose-add the four 128-bit sums.
  auto fold = [](__m512 v) __attribute__((always_inline)) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  };
  const __m128 fa = fold(a), fb = fold(b), fc = fold(c), fd = fold(d);
  return _mm_hadd_ps(_mm_hadd_ps(fa, fb), _mm_hadd_ps(fc, fd));
}

// One chunk c of R weight rows against T activation rows, into acc. Partial
// (the last chunk of a row that ends mid-chunk): bytes outside bm read as 0,
// as do the activations there (zero-padded).
template <int BITS, int G, int R, int T, bool PARTIAL>
__attribute__((always_inline)) inline void chunk(const uint8_t* const* wr, const uint8_t* const* a,
                                                 const float* const* dl, int64_t c, __mmask64 bm,
                                                 const __m512* slo, const __m512* shi, __m512i idx,
                                                 __m512 (&acc)[R][T]) {
  constexpr int64_t CV = BITS == 4 ? 128 : 64;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  __m512i lo[R], hi[R];
  __m512 sc[R];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    __m512i v;
    if constexpr (PARTIAL) {
      v = _mm512_maskz_loadu_epi8(bm, wr[i] + c * 64);
    } else {
      if constexpr (kPrefetch > 0)
        _mm_prefetch(reinterpret_cast<const char*>(wr[i] + c * 64 + kPrefetch), _MM_HINT_T0);
      v = _mm512_loadu_si512(wr[i] + c * 64);
    }
    if constexpr (BITS == 4) {
      lo[i] = _mm512_and_si512(v, nib);
      hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    } else {
      lo[i] = v;
    }
    sc[i] = _mm512_permutex2var_ps(slo[i], idx, shi[i]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    const __m512i xl = _mm512_load_si512(a[j] + c * CV);
    __m512i xh;
    if constexpr (BITS == 4) xh = _mm512_load_si512(a[j] + c * CV + 64);
    const __m512 d = _mm512_load_ps(dl[j] + c * 16);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xl);
      if constexpr (BITS == 4) s = _mm512_dpbusd_epi32(s, hi[i], xh);
      acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc[i], d), acc[i][j]);
    }
  }
}

// out[i][j] = W row i · activation row j for R weight rows and T activations,
// G the group size.
//
// Each row's scales are loaded 32 groups at a time into two registers (f32);
// a chunk's lane scales are then one vpermt2ps of them with the chunk's
// group indices.
template <int BITS, DType SD, int G, int R, int T>
inline void tile(const uint8_t* const* wr, const uint8_t* const* sr, const uint8_t* const* br,
                 const uint8_t* const* act, const Layout& L, const WeightMatrix& w,
                 float out[R][T]) {
  constexpr int64_t CV = BITS == 4 ? 128 : 64;  // values per chunk
  constexpr int64_t SB = SD == DType::F32 ? 4 : 2;
  constexpr int64_t kBlockGroups = 32;  // scales held in registers per row
  constexpr int64_t kBlockChunks = kBlockGroups * G / CV;
  const int64_t cols = w.cols, groups = w.cols / G;
  const int64_t nch = (cols + CV - 1) / CV, full = cols / CV;
  // Lane k covers values (BITS == 4 ? 8k : 4k) of the chunk: its group,
  // counted from the chunk's first group.
  const __m512i lane_group =
      _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                        G == 32   ? (BITS == 4 ? 2 : 3)
                        : G == 64 ? (BITS == 4 ? 3 : 4)
                                  : 4);
  __m512 acc[R][T];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint8_t* a[T];
  const float* dl[T];
  for (int j = 0; j < T; ++j) {
    a[j] = act[j];
    dl[j] = reinterpret_cast<const float*>(act[j] + L.lanes);
  }
  for (int64_t c0 = 0; c0 < nch; c0 += kBlockChunks) {
    const int64_t g0 = c0 * CV / G, gn = groups - g0;
    __m512 slo[R], shi[R];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      slo[i] = load_sc<SD>(sr[i] + g0 * SB, mask16(gn));
      shi[i] = load_sc<SD>(sr[i] + (g0 + 16) * SB, mask16(gn - 16));
    }
    const int64_t c1 = c0 + kBlockChunks < full ? c0 + kBlockChunks : full;
    // The chunk's first group, relative to the block, in every lane.
    __m512i idx = lane_group;
    const __m512i step = _mm512_set1_epi32(CV >= G ? int32_t(CV / G) : 0);
    for (int64_t c = c0; c < c1; ++c) {
      if constexpr (CV < G)  // 8-bit, G = 128: two chunks per group
        idx = _mm512_add_epi32(lane_group, _mm512_set1_epi32(int32_t((c - c0) * CV / G)));
      chunk<BITS, G, R, T, false>(wr, a, dl, c, 0, slo, shi, idx, acc);
      if constexpr (CV >= G) idx = _mm512_add_epi32(idx, step);
    }
    if (full < nch && full < c0 + kBlockChunks) {
      const int64_t rem = cols - full * CV;
      idx = _mm512_add_epi32(lane_group, _mm512_set1_epi32(int32_t(full * CV / G - g0)));
      chunk<BITS, G, R, T, true>(wr, a, dl, full, (__mmask64(1) << (rem * BITS / 8)) - 1, slo, shi,
                                 idx, acc);
    }
  }
  // The bias term Σ_g b_g · (Σ_{i∈g} d·q_i), into the same accumulators.
  for (int j = 0; j < T; ++j) {
    const float* sums = reinterpret_cast<const float*>(act[j] + L.sums);
    for (int64_t g = 0; g < groups; g += 16) {
      const __mmask16 m = mask16(groups - g);
      const __m512 xs = _mm512_load_ps(sums + g);  // zero-padded to 16
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i)
        acc[i][j] = _mm512_fmadd_ps(load_sc<SD>(br[i] + g * SB, m), xs, acc[i][j]);
    }
  }
  if constexpr (R == 4) {
    for (int j = 0; j < T; ++j) {
      alignas(16) float o[4];
      _mm_store_ps(o, reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
      for (int i = 0; i < 4; ++i) out[i][j] = o[i];
    }
  } else {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
  }
}

template <int BITS, DType SD, int G, int R, int T>
inline void run_tile(const uint8_t* acts, int64_t t0, const Layout& L, const WeightMatrix& w,
                     const int64_t* r, const float* bias, float* y) {
  const int64_t gb = groups_of(w) * dsize(SD);
  const uint8_t *wr[R], *sr[R], *br[R], *act[T];
  for (int i = 0; i < R; ++i) {
    wr[i] = static_cast<const uint8_t*>(w.data) + r[i] * row_bytes_of(w);
    sr[i] = static_cast<const uint8_t*>(w.scales) + r[i] * gb;
    br[i] = static_cast<const uint8_t*>(w.biases) + r[i] * gb;
  }
  for (int j = 0; j < T; ++j) act[j] = acts + (t0 + j) * L.total;
  float out[R][T];
  tile<BITS, SD, G, R, T>(wr, sr, br, act, L, w, out);
  for (int j = 0; j < T; ++j)
    for (int i = 0; i < R; ++i)
      y[(t0 + j) * w.rows + r[i]] = out[i][j] + (bias ? bias[r[i]] : 0.0f);
}

constexpr int kStreams = 4;  // decode: far-apart weight rows at once (see kernels_avx512.cpp)
constexpr int kTileT = 4;    // prefill: activation rows per tile
constexpr int64_t kTokenBlock = 64;  // prefill: activation rows kept in L2 per pass over W

template <int BITS, DType SD, int G>
void compute_impl(const uint8_t* acts, int64_t n, const WeightMatrix& w, const float* bias,
                  float* y, int64_t r0, int64_t r1) {
  const Layout L = layout(w);
  if (n == 1) {
    // Decode: kStreams rows far apart (row k, k + h, ...) of the band at once;
    // adjacent rows or one row at a time measured 20-45% slower.
    const int64_t h = (r1 - r0) / kStreams;
    for (int64_t k = 0; k < h; ++k) {
      int64_t r[kStreams];
      for (int i = 0; i < kStreams; ++i) r[i] = r0 + i * h + k;
      run_tile<BITS, SD, G, kStreams, 1>(acts, 0, L, w, r, bias, y);
    }
    for (int64_t r = r0 + kStreams * h; r < r1; ++r)
      run_tile<BITS, SD, G, 1, 1>(acts, 0, L, w, &r, bias, y);
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t t1 = n - t0 < kTokenBlock ? n : t0 + kTokenBlock;
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) {
      const int64_t rr[2] = {r, r + 1};
      int64_t t = t0;
      for (; t + kTileT <= t1; t += kTileT)
        run_tile<BITS, SD, G, 2, kTileT>(acts, t, L, w, rr, bias, y);
      for (; t < t1; ++t) run_tile<BITS, SD, G, 2, 1>(acts, t, L, w, rr, bias, y);
    }
    if (r < r1) {
      int64_t t = t0;
      for (; t + kTileT <= t1; t += kTileT)
        run_tile<BITS, SD, G, 1, kTileT>(acts, t, L, w, &r, bias, y);
      for (; t < t1; ++t) run_tile<BITS, SD, G, 1, 1>(acts, t, L, w, &r, bias, y);
    }
  }
}

template <int BITS, DType SD>
void compute_sd(const uint8_t* acts, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                int64_t r0, int64_t r1) {
  switch (w.group_size) {
    case 32: return compute_impl<BITS, SD, 32>(acts, n, w, bias, y, r0, r1);
    case 64: return compute_impl<BITS, SD, 64>(acts, n, w, bias, y, r0, r1);
    default: return compute_impl<BITS, SD, 128>(acts, n, w, bias, y, r0, r1);
  }
}

#include "backend/cpu/quant_dispatch.inc"

}  // namespace

const QuantKernels kAvx512VnniQuant = {"avx512-vnni", act_bytes, prepare, compute};

}  // namespace tandem::cpu::detail
