// The arithmetic peak of one core, which the prefill GEMM's GFLOP/s
// (bench/gemv.cpp) are compared with: 24 independent accumulator chains of
// 512-bit f32 FMAs (vfmadd231ps) and of bf16 dot products (vdpbf16ps, two
// products a lane), long enough that latency is hidden. Run it once per
// core at the same time (`cpu_peak & cpu_peak & wait`) for the machine's.
//
//   cpu_peak [--seconds S]
#include <immintrin.h>

#include <cstdio>

#include "bench_util.h"

// GCC 12's AVX-512 headers trip -Wuninitialized (GCC PR 105593; see
// src/backend/cpu/kernels_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

constexpr int kChains = 24;

__attribute__((target("avx512f"), noinline)) double fma_gflops(long iters) {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(float(k));
  const __m512 f = _mm512_set1_ps(0.999f);
  const double t0 = bench::now_s();
  for (long i = 0; i < iters; ++i)
#pragma GCC unroll 24
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_fmadd_ps(acc[k], f, f);
  const double dt = bench::now_s() - t0;
  float sink = 0;
  for (int k = 0; k < kChains; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  std::printf("%s", sink == 12345.f ? " " : "");  // keeps the chains alive
  return double(iters) * kChains * 16 * 2 / dt / 1e9;
}

__attribute__((target("avx512f,avx512bf16"), noinline)) double bf16_dot_gflops(long iters) {
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(float(k));
  const __m512bh x = __m512bh(_mm512_set1_epi16(0x3c00));
  const double t0 = bench::now_s();
  for (long i = 0; i < iters; ++i)
#pragma GCC unroll 24
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], x, x);
  const double dt = bench::now_s() - t0;
  float sink = 0;
  for (int k = 0; k < kChains; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  std::printf("%s", sink == 12345.f ? " " : "");
  return double(iters) * kChains * 32 * 2 / dt / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv);
  const double seconds = args.get("--seconds", 1.0);
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("no AVX-512 on this processor: nothing to measure\n");
    return 0;
  }
  // ~1e9 instructions a second per chain set: size the loop to `seconds`.
  const long iters = long(seconds * 1e8);
  std::printf("one core: f32 FMA (zmm) %.1f GFLOP/s", fma_gflops(iters));
  if (__builtin_cpu_supports("avx512bf16"))
    std::printf(", bf16 dot products (vdpbf16ps zmm) %.1f GFLOP/s\n", bf16_dot_gflops(iters));
  else
    std::printf("; no AVX-512 BF16\n");
  return 0;
}
