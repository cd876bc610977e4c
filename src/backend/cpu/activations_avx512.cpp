// AVX-512 gated activations of the MLP (ops.h's silu_mul, gelu_tanh_mul):
// the same formulas as the scalar reference in ops.cpp, 16 lanes at a time,
// with exp512 (~1e-7 relative, as expf) in place of libm's expf. On the
// 2-core EPYC the scalar loops took 4-5% of a llama-3.2-1B prefill.
// kernels_impl.h's rules hold: anonymous namespace, no shared inline helpers.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC PR 105593, as kernels_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {
namespace {

#include "backend/cpu/exp512.inc"

inline __mmask16 tail_mask(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// gate[i] = gate[i] / (1 + exp(arg(gate[i]))) · up[i], i < n.
template <typename Arg>
inline void gated(float* gate, const float* up, int64_t n, Arg arg) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp512(arg(g));
    const __m512 r =
        _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, up + i));
    _mm512_mask_storeu_ps(gate + i, m, r);
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  const __m512 zero = _mm512_setzero_ps();
  gated(gate, up, n, [&](__m512 g) { return _mm512_sub_ps(zero, g); });
}

// 0.5·g·(1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi)·(g + 0.044715·g³).
void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  const __m512 k2 = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
  const __m512 c = _mm512_set1_ps(0.044715f);
  gated(gate, up, n, [&](__m512 g) {
    const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(c, g), g), g);
    return _mm512_mul_ps(k2, _mm512_add_ps(g, cube));
  });
}

}  // namespace

const GatedKernels kAvx512Gated = {silu_mul, gelu_tanh_mul};

}  // namespace tandem::cpu::detail
