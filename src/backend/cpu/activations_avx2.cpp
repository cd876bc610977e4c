// AVX2 gated activations of the MLP (ops.h's silu_mul, gelu_tanh_mul): the
// scalar reference's formulas (ops.cpp), 8 lanes at a time with exp256.
// kernels_impl.h's rules hold: anonymous namespace, no shared inline helpers.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_impl.h"

namespace tandem::cpu::detail {
namespace {

#include "backend/cpu/exp256.inc"

// gate[i] = gate[i] / (1 + exp(arg(gate[i]))) · up[i], i < n; the last
// n % 8 values by the same formula, one lane at a time.
template <typename Arg>
inline void gated(float* gate, const float* up, int64_t n, Arg arg) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(arg(g));
    _mm256_storeu_ps(
        gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const __m256 g = _mm256_set1_ps(gate[i]);
    const __m256 e = exp256(arg(g));
    gate[i] = _mm256_cvtss_f32(
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_set1_ps(up[i])));
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  const __m256 zero = _mm256_setzero_ps();
  gated(gate, up, n, [&](__m256 g) { return _mm256_sub_ps(zero, g); });
}

// 0.5·g·(1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi)·(g + 0.044715·g³).
void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  const __m256 k2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f);
  const __m256 c = _mm256_set1_ps(0.044715f);
  gated(gate, up, n, [&](__m256 g) {
    const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(c, g), g), g);
    return _mm256_mul_ps(k2, _mm256_add_ps(g, cube));
  });
}

}  // namespace

const GatedKernels kAvx2Gated = {silu_mul, gelu_tanh_mul};

}  // namespace tandem::cpu::detail
