// Matmuls over WeightFormat::PackedBf16 weights (core/tensor.h): one 64-byte
// vector holds a column pair of 16 consecutive rows, so a micro-tile is an
// outer product — a weight vector times a broadcast activation pair adds into
// 16 outputs at once. Against the dot-product GEMM over weights in place
// (kernels_avx512bf16.cpp), each product reads 4 bytes of the activations
// instead of 64 and needs no horizontal sums: on the 2-core EPYC, 8 tokens x
// 48 rows at n = 64 ran at 375-390 GFLOP/s a core against 265-290 (and 440
// with every operand in L1). Compiled with -mavx512bf16 and reached only
// where cpuid reports it; keeps kernels_impl.h's rules (anonymous namespace,
// no shared inline helpers).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

// k values per block: a panel of kRv · 16 rows x kKc bf16 (96 KiB) stays in
// L2 while every token tile of the call goes by it. Steps of at most kT
// tokens have no reuse to block for and stream each row vector in one pass.
constexpr int64_t kKc = 1024;
constexpr int kT = 8;
// Row vectors per micro-tile: bf16 inputs 8 x 3 accumulators (+3 weight
// vectors, a broadcast); f32 inputs 8 x 2 (each weight vector widens into
// its even and odd columns, so twice the registers and FMAs per vector).
// Decode steps of 1-2 tokens: kStreams row vectors far apart (packed_decode).
constexpr int kRvBf16 = 3;
constexpr int kRvF32 = 2;
constexpr int kStreams = 4;

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Lanes [0, n) of a 16-lane mask (n >= 16: all; n <= 0: none).
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

struct Tile {
  const uint16_t* w;  // row vector 0 of the panel at the block's first column pair
  int64_t vstride;    // elements between row vectors (16 · cols when adjacent)
  const void* x;      // token 0 at the block's first column (float or bf16 bits)
  int64_t ldx;        // elements between tokens
  int64_t pairs;      // column pairs in the block
  float* y;           // y[t · ldy + ystride · v + i]
  int64_t ldy;
  int64_t ystride = 16;  // outputs (and biases) between row vectors
  const float* bias;     // of the panel's row 0, or null
  int64_t valid;         // rows from the panel's row 0 that exist (the rest are padding)
  bool first;            // the first k block: start from the bias, else from y
  // The share of the next panel's weights this tile prefetches while it
  // computes (packed_matmul): pf_pairs column pairs of its row vectors
  // (vstride apart) from pf, one pair every pf_every of this tile's pairs.
  const uint16_t* pf = nullptr;
  int64_t pf_pairs = 0;
  int64_t pf_every = 1;
};

// The panel's row-vector masks (padding rows excluded), and the
// accumulators' start: the bias (or zero) in the first k block, else y.
template <int T, int RV>
inline void load_acc(const Tile& a, __m512 (&acc)[T][RV], __mmask16 (&m)[RV]) {
  for (int v = 0; v < RV; ++v) m[v] = lanes(a.valid - a.ystride * v);
  for (int v = 0; v < RV; ++v) {
    const __m512 b = a.first && a.bias ? _mm512_maskz_loadu_ps(m[v], a.bias + a.ystride * v)
                                       : _mm512_setzero_ps();
    for (int t = 0; t < T; ++t)
      acc[t][v] = a.first ? b : _mm512_maskz_loadu_ps(m[v], a.y + t * a.ldy + a.ystride * v);
  }
}

template <int T, int RV>
inline void store_acc(const Tile& a, const __m512 (&acc)[T][RV], const __mmask16 (&m)[RV]) {
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < RV; ++v)
      _mm512_mask_storeu_ps(a.y + t * a.ldy + a.ystride * v, m[v], acc[t][v]);
}

// After each column pair of a micro-tile: the next pair of the tile's share
// of prefetches (Tile::pf), when it is due.
template <int RV>
inline void prefetch_step(const Tile& a, int64_t& next, int64_t& wait) {
  if (next >= a.pf_pairs || --wait > 0) return;
  for (int v = 0; v < RV; ++v)
    _mm_prefetch(reinterpret_cast<const char*>(a.pf + v * a.vstride + next * 32), _MM_HINT_T0);
  ++next;
  wait = a.pf_every;
}

// T tokens of bf16 activations against RV row vectors: vdpbf16ps of the
// weights' column pair with the token's pair broadcast.
template <int T, int RV>
inline void micro_bf16(const Tile& a) {
  __mmask16 m[RV];
  __m512 acc[T][RV];
  load_acc<T, RV>(a, acc, m);
  const auto* x = static_cast<const uint32_t*>(a.x);  // pairs of bf16
  const int64_t ldp = a.ldx / 2;
  int64_t next = 0, wait = 0;  // the next pair to prefetch, pairs until then
  for (int64_t p = 0; p < a.pairs; ++p) {
    __m512bh w[RV];
    for (int v = 0; v < RV; ++v) w[v] = __m512bh(_mm512_loadu_si512(a.w + v * a.vstride + p * 32));
    for (int t = 0; t < T; ++t) {
      const __m512bh xp = __m512bh(_mm512_set1_epi32(int(x[t * ldp + p])));
      for (int v = 0; v < RV; ++v) acc[t][v] = _mm512_dpbf16_ps(acc[t][v], w[v], xp);
    }
    prefetch_step<RV>(a, next, wait);
  }
  store_acc<T, RV>(a, acc, m);
}

// T tokens of f32 activations against RV row vectors: each weight vector
// widened exactly to its even and odd columns (bf16 is f32's top half), two
// FMAs against the token's two values. The exact lane and the decode GEMV.
template <int T, int RV>
inline void micro_f32(const Tile& a) {
  __mmask16 m[RV];
  __m512 acc[T][RV];
  load_acc<T, RV>(a, acc, m);
  const auto* x = static_cast<const float*>(a.x);
  const __m512i odd_mask = _mm512_set1_epi32(int(0xffff0000u));
  int64_t next = 0, wait = 0;  // as micro_bf16
  for (int64_t p = 0; p < a.pairs; ++p) {
    __m512 even[RV], odd[RV];
    for (int v = 0; v < RV; ++v) {
      const __m512i w = _mm512_loadu_si512(a.w + v * a.vstride + p * 32);
      even[v] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      odd[v] = _mm512_castsi512_ps(_mm512_and_si512(w, odd_mask));
    }
    for (int t = 0; t < T; ++t) {
      const __m512 x0 = _mm512_set1_ps(x[t * a.ldx + 2 * p]);
      const __m512 x1 = _mm512_set1_ps(x[t * a.ldx + 2 * p + 1]);
      for (int v = 0; v < RV; ++v) {
        acc[t][v] = _mm512_fmadd_ps(even[v], x0, acc[t][v]);
        acc[t][v] = _mm512_fmadd_ps(odd[v], x1, acc[t][v]);
      }
    }
    prefetch_step<RV>(a, next, wait);
  }
  store_acc<T, RV>(a, acc, m);
}

// One row vector of 1-2 tokens (f32): the decode GEMV's last vectors of a
// band (packed_decode), with 4 column pairs in flight into separate even and
// odd accumulators (8 FMA chains a token).
template <int T>
inline void micro_f32_stream(const Tile& a) {
  constexpr int U = 4;
  __mmask16 m1[1];
  __m512 acc[T][1];
  load_acc<T, 1>(a, acc, m1);
  __m512 part[T][2 * U];
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < 2 * U; ++u) part[t][u] = _mm512_setzero_ps();
  const auto* x = static_cast<const float*>(a.x);
  const __m512i odd_mask = _mm512_set1_epi32(int(0xffff0000u));
  auto pair = [&](int64_t p, int u) {
    const __m512i w = _mm512_loadu_si512(a.w + p * 32);
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(w, odd_mask));
    for (int t = 0; t < T; ++t) {
      part[t][2 * u] = _mm512_fmadd_ps(even, _mm512_set1_ps(x[t * a.ldx + 2 * p]), part[t][2 * u]);
      part[t][2 * u + 1] =
          _mm512_fmadd_ps(odd, _mm512_set1_ps(x[t * a.ldx + 2 * p + 1]), part[t][2 * u + 1]);
    }
  };
  int64_t p = 0;
  for (; p + U <= a.pairs; p += U)
    for (int u = 0; u < U; ++u) pair(p + u, u);
  for (; p < a.pairs; ++p) pair(p, 0);
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < 2 * U; ++u) acc[t][0] = _mm512_add_ps(acc[t][0], part[t][u]);
  store_acc<T, 1>(a, acc, m1);
}

// One micro-tile of `tokens` (1..kT) tokens and RV row vectors.
template <bool Bf16, int RV, int T = 1>
inline void micro_tokens(const Tile& a, int64_t tokens) {
  if constexpr (T < kT) {
    if (tokens != T) return micro_tokens<Bf16, RV, T + 1>(a, tokens);
  }
  if constexpr (Bf16)
    micro_bf16<T, RV>(a);
  else if constexpr (RV == 1 && T <= 2)
    micro_f32_stream<T>(a);
  else
    micro_f32<T, RV>(a);
}

// One micro-tile of `vectors` (1..RV) row vectors.
template <bool Bf16, int RV>
inline void micro_tile(const Tile& a, int64_t tokens, int64_t vectors) {
  if constexpr (RV > 1) {
    if (vectors < RV) return micro_tile<Bf16, RV - 1>(a, tokens, vectors);
  }
  micro_tokens<Bf16, RV>(a, tokens);
}

void decode_tile(const Tile& a, int64_t tokens);
void decode_rest(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1);
#include "backend/cpu/packed_driver.inc"

// y[t, r] for t < n, r in [r0, r1) (r0 a multiple of 16): k blocks, then
// panels of RV row vectors, then token tiles. With several token tiles, the tiles of a panel share
// out the prefetch of the next panel's weights: each panel is read from memory once, and without it
// the first tile ran at the memory's pace (one core streams ~25 GB/s; the tile consumes weights at
// ~50).
template <bool Bf16, int RV>
void packed_matmul(const void* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                   int64_t r0, int64_t r1) {
  const int64_t cols = w.cols, rows = w.rows;
  const size_t x_size = Bf16 ? 2 : 4;
  const int64_t kc_max = n <= kT ? cols : kKc;
  const int64_t tiles = (n + kT - 1) / kT;
  const auto* W = static_cast<const uint16_t*>(w.data);
  for (int64_t k0 = 0; k0 < cols || k0 == 0; k0 += kc_max) {
    const int64_t kc = min64(kc_max, cols - k0);
    for (int64_t r = r0; r < r1; r += 16 * RV) {
      const int64_t vectors = min64(RV, (r1 - r + 15) / 16);
      Tile a = panel_tile(w, r, k0, kc, bias, r1);
      // The next panel: the next rows in this k block, else the first ones
      // of the next block (none after the last).
      const bool last_rows = r + 16 * RV >= r1;
      const int64_t next_k0 = last_rows ? k0 + kc : k0;
      const int64_t next_pairs =
          tiles > 1 && next_k0 < cols ? min64(kc_max, cols - next_k0) / 2 : 0;
      const int64_t share = (next_pairs + tiles - 1) / tiles;
      const uint16_t* next = W + (last_rows ? r0 : r + 16 * RV) * cols + next_k0 * 16;
      for (int64_t t = 0, i = 0; t < n; t += kT, ++i) {
        a.x = static_cast<const uint8_t*>(x) + (t * cols + k0) * x_size;
        a.y = y + t * rows + r;
        if (next_pairs > 0) {
          a.pf = next + min64(i * share, next_pairs) * 32;
          a.pf_pairs = min64(share, next_pairs - min64(i * share, next_pairs));
          a.pf_every = share > 0 ? (a.pairs + share - 1) / share : 1;
        }
        micro_tile<Bf16, RV>(a, min64(kT, n - t), vectors);
      }
    }
    if (cols == 0) break;
  }
}

void decode_tile(const Tile& a, int64_t tokens) {
  micro_tokens<false, kStreams>(a, tokens);
}

void decode_rest(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1) {
  packed_matmul<false, 1>(x, n, w, bias, y, r0, r1);
}

void matmul_f32(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                int64_t r0, int64_t r1) {
  if (n <= 2) return packed_decode(x, n, w, bias, y, r0, r1);
  packed_matmul<false, kRvF32>(x, n, w, bias, y, r0, r1);
}

void matmul_bf16(const uint16_t* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1) {
  packed_matmul<true, kRvBf16>(x, n, w, bias, y, r0, r1);
}

// 16 rows x 16 column pairs (row stride ld) into 16 vectors of the packed
// layout: a transpose of 32-bit elements in four shuffle stages.
inline void transpose16(const uint16_t* src, int64_t ld, uint16_t* dst) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * 32, r[i]);
}

// Row blocks [b0, b1) of a dense rows x cols BF16 matrix (cols even) into
// the packed layout: whole blocks of whole 32-column chunks by transposes,
// the rest (a last partial block, a row length not a multiple of 32) by the
// portable loop.
void pack(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    if (b * 16 + 16 > rows || cols % 32 != 0) {
      kScalarPackedKernels.pack(src, rows, cols, dst, b, b + 1);
      continue;
    }
    for (int64_t c = 0; c < cols; c += 32)
      transpose16(src + b * 16 * cols + c, cols, dst + b * 16 * cols + c * 16);
  }
}

}  // namespace

const PackedKernels kAvx512PackedKernels = {pack, matmul_f32, matmul_bf16};

}  // namespace tandem::cpu::detail
