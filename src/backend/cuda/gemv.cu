// Decode GEMV over bf16 and f32 weights: the kernel that decides batch-1
// decode speed, since it streams every weight once per step. The fusions of
// GemvFusion (input norm, bias, residual add, gated MLP) ride in its loop
// and epilogue (gemv_fusion.h).
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/device_matrix.h"
#include "backend/cuda/gemv_fusion.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace gemv {

void check_fusion(const GemvFusion& f, int64_t rows, const char* what, bool pre_add_ok,
                  bool quantized_ok) {
  if (f.pre_add && !pre_add_ok)
    fail(
        "%s: the sandwich-norm fusion (pre_add) runs only in gemv_affine and gemv_bf16 "
        "(cols %% 8 == 0, 16-byte aligned rows and batches of at most %lld)",
        what, (long long)kGemvPreAddMaxRows);
  if (f.pre_add && (!f.pre_add_weight || !f.residual_out))
    fail("%s: the sandwich-norm fusion (pre_add) needs a pre_add_weight and a residual_out", what);
  if (f.accumulate && f.gate != GemvGate::None)
    fail("%s: a gated GEMV cannot also accumulate into its output", what);
  if (f.times && (f.gate != GemvGate::None || f.accumulate || f.times_act == GemvGate::None))
    fail("%s: times needs times_act and excludes gate and accumulate", what);
  if (f.pre_add_scale != 1.f && !f.pre_add)
    fail("%s: pre_add_scale scales the pre_add input and needs pre_add", what);
  if ((f.quantized_out || f.quantized_in) && !quantized_ok)
    fail("%s: quantized_out and quantized_in run only in gemv_affine", what);
  if (f.gate != GemvGate::None && rows % 2 != 0)
    fail("%s: a gated GEMV needs gate and up rows (an even count), got %lld rows", what,
         (long long)rows);
}

int resident_blocks(const void* kernel) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarpsPerBlock * 32, 0) !=
      cudaSuccess)
    return 1;
  return std::max(blocks, 1);
}

int column_split(int64_t units, int64_t chunks, int64_t min_chunks) {
  // The packed GEMV's rule (the bf16 GEMV's until the thirteenth session).
  // At 16 warps an SM the last doubling stops below 32 (the packed
  // kernel's 4 blocks of 8 warps an SM): the largest split that stays
  // within one wave of warp slots. 24 put ministral-3-3b's q/k/v, o and
  // down, llama-3.2-1b's q/k/v, gemma-3-1b's down and gemma-4-e2b's q/k/v,
  // o and down at 1.1-1.45 waves, whose last warps ran nearly alone.
  // Measured on the H100 (session 39, --quantize 4, context 128, tok/s, 24
  // -> 16, two runs alternated): batch 1 ministral 720.7 / 715.9 -> 764.0 /
  // 763.3, llama 1,863 / 1,860 -> 1,910 / 1,907, gemma-3 1,180 / 1,178 ->
  // 1,253 / 1,252, gemma-4 620.3 / 621.3 -> 662.0 / 655.5; batch 2
  // ministral 1,126 -> 1,214, llama 2,761 -> 2,823, gemma-3 2,001 -> 2,073,
  // gemma-4 991 -> 1,058, qwen3 1,649 -> 1,650 (its splits unchanged).
  // 32 lost (ministral 730, llama 1,686 at batch 1, session 38).
  static const int64_t warps_per_sm = env_count("TANDEM_CUDA_GEMV_WARPS", 16);
  if (warps_per_sm == 0) return 1;
  const int64_t want = warps_per_sm * current_launch_limits().multiprocessors;
  int split = 1;
  while (split < 8 && units * split < want && chunks / (2 * split) >= min_chunks) split *= 2;
  return split;
}

int column_split_in_waves(int64_t units, int64_t chunks, int64_t min_chunks, int blocks_per_sm,
                          bool past_wave) {
  // Measured on the H200 at batch 1, context 128, with 4 blocks an SM (tok/s,
  // the fill rule above / 100 / 125 / 150 percent): llama-3.2-1b 1,049 /
  // 1,197 / 1,197-1,201 / 1,169, ministral-3-3b 399 / 436 / 431-434 / 413,
  // qwen3-1.7b 647 / 731 / 733-735 / 717, gemma-4-e2b 405 / 423 / 419-424 /
  // 405, gemma-3-1b 864 / 839 / 861-865 / 870. Batch 2 (3 blocks an SM),
  // context 128, fill rule -> this one: llama 1,710 -> 1,750, qwen3 1,107 ->
  // 1,184, ministral 738 -> 753, gemma-3 1,380 -> 1,398, gemma-4 691 -> 714.
  // The packed GEMV tied under it (llama q4 1,523 -> 1,488, ministral 611 ->
  // 616) and keeps the fill rule.
  // One wave (100%) since session 39: on the H100 a launch just past one
  // wave ran slower alone (bench_cuda_kernels, batch 1: gemma-3-1b's down,
  // split 8 at 1.09 waves 9.16 us -> split 4 at 0.55 waves 7.83 us;
  // gemma-4-e2b's 2,560-row q/k/v 6.45 -> 5.37 us, its 5,120-row q/k/v
  // 9.30 -> 7.91 us; no other shape's split moves), and in the decode step
  // (context 128, tok/s, 125% -> 100%, three runs alternated) gemma-4-e2b
  // 395.3 / 395.2 / 394.1 -> 399.4 / 399.3 / 398.5, gemma-3-1b 832.2 /
  // 827.5 / 834.1 -> 831.6 / 838.9 / 837.9 (session 38, another H100:
  // +0.5-0.9%). The H200 figures above (thirteenth session, older kernels)
  // had 125% ahead for gemma-3-1b: to be measured again there.
  static const int64_t waves_percent = env_count("TANDEM_CUDA_GEMV_WAVES", 100);
  if (waves_percent == 0) return 1;
  const int64_t slots =  // warps in one wave
      int64_t(blocks_per_sm) * kWarpsPerBlock * current_launch_limits().multiprocessors;
  const int64_t most = waves_percent * slots / 100;
  int split = 1;
  while (split < 8 && units * split * 2 <= most && chunks / (2 * split) >= min_chunks) split *= 2;
  // Between one wave of warp slots and two (ministral-3-3b's gate/up: 4,608
  // units of two pairs for 4,224 slots of 132 SMs), the units past the
  // first wave run nearly alone at the end, each at one warp's latency-bound
  // pace. Split into the most column shares that keep kPastWaveMinChunks
  // loads a row, the tail is shorter. Measured on the H100 at batch 1,
  // context 128 (tok/s, shares 1 / 2 / 4 / 8, two runs): ministral-3-3b
  // (384 chunks a row) 348.6 / 363.0 / 368.8 / 354.1 and 346.8 / 361.0 /
  // 368.4 / 355.0; gemma-4-e2b (192 chunks; its double-wide gate/up)
  // 388.3 / 394.1 / 376.5 / 339.6 and 386.1 / 394.4 / 378.5 / 342.6;
  // with the rule (2 and 4 shares) against none: ministral 348.8 / 348.3 ->
  // 365.3 / 367.8, at context 4,096 322.6 -> 336.8; gemma-4-e2b 393.7 /
  // 394.5 -> 395.6 / 396.6. At batch 2 (gemma-4-e2b's gate/up, one pair a
  // warp, in 2 shares) it lost 695.2 -> 675.2: callers ask for it at batch 1.
  // TANDEM_CUDA_GEMV_PAST_WAVE=0 (for measuring) leaves such matrices whole.
  constexpr int64_t kPastWaveMinChunks = 96;
  static const bool past_wave_on = !env_is("TANDEM_CUDA_GEMV_PAST_WAVE", "0");
  if (past_wave && past_wave_on && split == 1 && units > slots && units <= 2 * slots)
    while (split < 8 && chunks / (2 * split) >= kPastWaveMinChunks) split *= 2;
  return split;
}

}  // namespace gemv

namespace {

using namespace gemv;

// Chunk i + 32u (u < UNROLL, i + 32u < chunks) of each of the warp's ROWS
// rows into v.
template <int ROWS, int UNROLL>
__device__ __forceinline__ void load_chunks(const uint4* (&w)[ROWS], int64_t i, int64_t chunks,
                                            uint4 (&v)[ROWS][UNROLL]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + 32 * u < chunks) v[r][u] = __ldg(w[r] + i + 32 * u);
}

// The rest of a warp's pass over its rows' `chunks` 16-byte chunks (lane
// takes chunks lane, lane + 32, ...), UNROLL per row in flight (the last
// batch partial); v holds the first batch (load_chunks(w, lane, chunks, v),
// issued before the PDL wait). consume(wv, c): the rows' chunks at column
// c (counted from w).
template <int ROWS, int UNROLL, class Consume>
__device__ __forceinline__ void stream_rows(const uint4* (&w)[ROWS], int64_t chunks,
                                            uint4 (&v)[ROWS][UNROLL], Consume&& consume) {
  const int lane = threadIdx.x % 32;
  for (int64_t i = lane; i < chunks; i += 32 * UNROLL) {
    if (i != lane) load_chunks<ROWS, UNROLL>(w, i, chunks, v);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (i + 32 * u >= chunks) break;
      uint4 wv[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[r] = v[r][u];
      consume(wv, (i + 32 * u) * 8);
    }
  }
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float sum4(float4 a) {
  return a.x + a.y + a.z + a.w;
}

// The products of the 8-column chunk at column c: the warp's ROWS weight
// chunks `wv` against every batch row's activations, each loaded once for
// all rows. When normalizing, it also sums each batch row's squares and
// applies the norm weight (the 1 / RMS scale comes in the epilogue).
template <int N, int ROWS>
__device__ __forceinline__ void chunk8(const uint4 (&wv)[ROWS], const float* x, int64_t cols,
                                       int64_t c, const GemvFusion& f, float (&acc)[ROWS][N],
                                       float (&ss)[N]) {
  float w[ROWS][8];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) widen8(wv[r], w[r]);
  float4 ga = make_float4(1.f, 1.f, 1.f, 1.f), gb = ga;
  if (f.normalize && f.norm_weight) {
    ga = __ldg(reinterpret_cast<const float4*>(f.norm_weight + c));
    gb = __ldg(reinterpret_cast<const float4*>(f.norm_weight + c) + 1);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float4* xp = reinterpret_cast<const float4*>(x + t * cols + c);
    float4 a = xp[0], b = xp[1];
    if (f.normalize) {
      ss[t] += sum4(mul4(a, a)) + sum4(mul4(b, b));
      a = mul4(a, ga), b = mul4(b, gb);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][t] += dot8(w[r], a, b);
  }
}

// cols % 8 == 0: 16-byte loads. Each warp owns ROWS rows (WarpRows) and
// reuses every activation chunk it loads for all of them; UNROLL chunks per
// row are in flight at once (memory-level parallelism is what a GEMV needs
// to reach HBM bandwidth), and SPLIT warps share a unit's columns
// (ColumnShare) when its rows alone would leave SMs short of warps.
template <int N, int ROWS, int UNROLL, bool GATED, int SPLIT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, gemv_min_blocks(N))
    gemv_bf16_vec(const uint16_t* __restrict__ W, int64_t rows, int64_t cols, const float* x,
                  float* y, GemvFusion f) {
  const WarpRows<ROWS, GATED> wr(ColumnShare<SPLIT>::unit(), rows);
  const int lane = threadIdx.x % 32;
  if (SPLIT == 1 && !wr.any()) return;  // split warps meet at gather_split's barrier
  const ColumnShare<SPLIT> share(cols / 8);
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    w[r] = reinterpret_cast<const uint4*>(W + wr.row(r) * cols) + share.first;
  float acc[ROWS][N], ss[N];
  zero_sums(acc, ss);
  // The first weight loads go out before waiting for the previous kernel
  // (PDL: weights are never written), so they overlap its tail.
  pdl_launch_dependents();
  uint4 v[ROWS][UNROLL];
  load_chunks<ROWS, UNROLL>(w, lane, share.count, v);
  pdl_wait();
  const float* xs = x + share.first * 8;
  const float* gs = f.norm_weight ? f.norm_weight + share.first * 8 : nullptr;
  GemvFusion fs = f;
  fs.norm_weight = gs;
  stream_rows<ROWS, UNROLL>(w, share.count, v, [&](const uint4(&wv)[ROWS], int64_t c) {
    chunk8<N, ROWS>(wv, xs, cols, c, fs, acc, ss);
  });
  if (!gather_split<N, ROWS, SPLIT>(acc, ss)) return;
  finish<N, ROWS, GATED>(wr, acc, ss, cols, f, y);
}

// GemvFusion::pre_add (Gemma's sandwich norms), cols % 8 == 0. Every block
// first builds each batch row's input — h' · norm_weight, normalized, or h'
// itself without normalize — in shared memory, so its warps read it from
// there: per warp, pre_add's four input vectors from L1/L2 cost more than
// the weights it streams (measured: per-warp loads made Gemma's batch-1 step
// slower, not faster).
// The prologue is one pass over global memory: x, pre_add · pre_add_weight
// and norm_weight go to shared memory while the block sums Σ pre_add², Σ x²,
// Σ x·u and Σ u² (u = pre_add · pre_add_weight); then s1 = 1 / RMS(pre_add),
// h' = x + s1 · u, and Σ h'² = Σ x² + 2 s1 Σ x·u + s1² Σ u² gives the
// second scale without another pass. Each block writes its share of h' to
// residual_out (float4 i goes to block i mod grid). The first weight loads
// go out before the prologue.
// Shared memory: (2N + 1) · cols floats (pre_add_smem_bytes), besides the
// static per-warp partial sums (pre_add_static_bytes).
size_t pre_add_smem_bytes(int n, int64_t cols) {
  return size_t(2 * n + 1) * size_t(cols) * sizeof(float);
}
size_t pre_add_static_bytes(int n) {
  return size_t(kWarpsPerBlock) * size_t(4 * n) * sizeof(float);
}

template <int N, int ROWS, int UNROLL, bool GATED, int SPLIT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, gemv_min_blocks(N))
    gemv_bf16_pre_add(const uint16_t* __restrict__ W, int64_t rows, int64_t cols, const float* x,
                      float* y, GemvFusion f) {
  extern __shared__ __align__(16) float staged[];
  float* hs = staged;                 // [N][cols]: x, then h' · norm_weight
  float* us = staged + N * cols;      // [N][cols]: pre_add · pre_add_weight
  float* gs = staged + 2 * N * cols;  // [cols]: norm_weight (1 when null)
  __shared__ float partial[kWarpsPerBlock][4 * N];
  const WarpRows<ROWS, GATED> wr(ColumnShare<SPLIT>::unit(), rows);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const ColumnShare<SPLIT> share(cols / 8);
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    w[r] = reinterpret_cast<const uint4*>(W + wr.row(r) * cols) + share.first;
  pdl_launch_dependents();
  uint4 v[ROWS][UNROLL];
  // Every warp loads (a unit past the end reads its clamped last row): with
  // SPLIT > 1 such warps stay for gather_split's barrier and consume v.
  load_chunks<ROWS, UNROLL>(w, lane, share.count, v);
  pdl_wait();

  // Prologue: stage and sum (oo, xx, xu, uu per batch row).
  float sums[4 * N];
#pragma unroll
  for (int k = 0; k < 4 * N; ++k) sums[k] = 0.f;
  const int64_t quads = cols / 4;
  for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
    const float4 pw = __ldg(reinterpret_cast<const float4*>(f.pre_add_weight) + i);
    const float4 g = f.normalize && f.norm_weight
                         ? __ldg(reinterpret_cast<const float4*>(f.norm_weight) + i)
                         : make_float4(1.f, 1.f, 1.f, 1.f);
    reinterpret_cast<float4*>(gs)[i] = g;
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float4 a = reinterpret_cast<const float4*>(x + t * cols)[i];
      const float4 o = reinterpret_cast<const float4*>(f.pre_add + t * cols)[i];
      const float4 u = mul4(o, pw);
      reinterpret_cast<float4*>(hs + t * cols)[i] = a;
      reinterpret_cast<float4*>(us + t * cols)[i] = u;
      sums[4 * t] += sum4(mul4(o, o));
      sums[4 * t + 1] += sum4(mul4(a, a));
      sums[4 * t + 2] += sum4(mul4(a, u));
      sums[4 * t + 3] += sum4(mul4(u, u));
    }
  }
#pragma unroll
  for (int k = 0; k < 4 * N; ++k) {
    const float s = warp_sum(sums[k]);
    if (lane == 0) partial[warp][k] = s;
  }
  __syncthreads();
  float s1[N], s2[N];
#pragma unroll
  for (int t = 0; t < N; ++t) {
    float oo = 0.f, xx = 0.f, xu = 0.f, uu = 0.f;
#pragma unroll
    for (int j = 0; j < kWarpsPerBlock; ++j) {
      oo += partial[j][4 * t], xx += partial[j][4 * t + 1];
      xu += partial[j][4 * t + 2], uu += partial[j][4 * t + 3];
    }
    s1[t] = inv_rms(oo, cols, f.norm_eps);
    const float k2 = f.pre_add_scale * f.pre_add_scale;  // Σ (k h')² = k² Σ h'²
    s2[t] = f.normalize ? inv_rms(fmaxf(k2 * (xx + 2.f * s1[t] * xu + s1[t] * s1[t] * uu), 0.f),
                                  cols, f.norm_eps)
                        : 1.f;
  }
  // h' = x + s1 · u: this block's share to residual_out, h' · g to hs.
  for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
    const float4 g = reinterpret_cast<const float4*>(gs)[i];
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float4 a = reinterpret_cast<const float4*>(hs + t * cols)[i];
      const float4 u = reinterpret_cast<const float4*>(us + t * cols)[i];
      const float k = f.pre_add_scale;
      const float4 h = make_float4((a.x + s1[t] * u.x) * k, (a.y + s1[t] * u.y) * k,
                                   (a.z + s1[t] * u.z) * k, (a.w + s1[t] * u.w) * k);
      if (i % gridDim.x == blockIdx.x) reinterpret_cast<float4*>(f.residual_out + t * cols)[i] = h;
      reinterpret_cast<float4*>(hs + t * cols)[i] = mul4(h, g);
    }
  }
  __syncthreads();
  if (SPLIT == 1 && !wr.any()) return;  // split warps meet at gather_split's barrier

  float acc[ROWS][N], ss[N];
  zero_sums(acc, ss);
  const float* hv = hs + share.first * 8;
  stream_rows<ROWS, UNROLL>(w, share.count, v, [&](const uint4(&wv)[ROWS], int64_t c) {
    float wf[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) widen8(wv[r], wf[r]);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float4 a = *reinterpret_cast<const float4*>(hv + t * cols + c);
      const float4 b = *reinterpret_cast<const float4*>(hv + t * cols + c + 4);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r][t] += dot8(wf[r], a, b);
    }
  });
  // The norm's scale is linear in each lane's partial sums.
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] *= s2[t];
  if (!gather_split<N, ROWS, SPLIT>(acc, ss)) return;
  GemvFusion plain = f;
  plain.normalize = false;
  finish<N, ROWS, GATED>(wr, acc, ss, cols, plain, y);
}

__device__ __forceinline__ float widen(float w) {
  return w;
}
__device__ __forceinline__ float widen(uint16_t w) {
  return __uint_as_float(uint32_t(w) << 16);
}

// Any shape, f32 or bf16 weights (odd shapes, f32 checkpoints): one warp
// per output (a gate/up pair when gated), coalesced 4-element steps when
// VEC4 (f32, cols % 4 == 0, aligned), else one element per lane at a time.
template <class Wt, bool VEC4, bool GATED>
__global__ void gemv_any(const Wt* __restrict__ W, int64_t rows, int64_t cols, const float* x,
                         int64_t n, float* y, GemvFusion f) {
  constexpr int R = GATED ? 2 : 1;
  const WarpRows<R, GATED> wr(int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32, rows);
  const int lane = threadIdx.x % 32;
  pdl_launch_dependents();
  pdl_wait();
  if (!wr.any()) return;
  const Wt* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = W + wr.row(r) * cols;
  const float* g = f.normalize ? f.norm_weight : nullptr;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    float acc[R][1], ss[1] = {0.f};
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = 0.f;
    if constexpr (VEC4) {
      for (int64_t c = lane; c < cols / 4; c += 32) {
        float4 a = reinterpret_cast<const float4*>(xt)[c];
        if (f.normalize) {
          ss[0] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
          if (g) {
            const float4 s = __ldg(reinterpret_cast<const float4*>(g) + c);
            a.x *= s.x, a.y *= s.y, a.z *= s.z, a.w *= s.w;
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4 b = __ldg(reinterpret_cast<const float4*>(w[r]) + c);
          acc[r][0] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
      }
    } else {
      for (int64_t c = lane; c < cols; c += 32) {
        float a = xt[c];
        if (f.normalize) {
          ss[0] += a * a;
          if (g) a *= g[c];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] += widen(w[r][c]) * a;
      }
    }
    finish<1, R, GATED>(wr, acc, ss, cols, from_row(f, t), y + t * wr.outputs);
  }
}

// The warp shape of gemv_bf16_vec for batch runs of N: rows per warp and
// 16-byte loads in flight per row. Batch 1: two rows (gated: two gate/up
// pairs), four loads a lane in flight either way (two a row, or one);
// larger batches share each activation chunk over 2 or 4 rows, two loads
// a row. Batch 1 held one row (a pair) a warp with four (two) loads a row
// until the twelfth session; the same loads spread over twice the rows
// measured on the H200 (tok/s, context 128, two runs): gemma-3-1b 773–785 →
// 873–878, ministral-3-3b 366–368 → 401–402, gemma-4-e2b 377–379 →
// 404–407, llama-3.2-1b 1,026–1,052 → 1,053–1,062, qwen3-1.7b 645–649 →
// 647–649 (fewer, longer-lived warps; each activation chunk serves two
// rows). Twice the rows with twice the loads won more on ministral (410)
// and gemma-4 (412–415) but lost 4% on llama and qwen3; eight loads a lane
// with one row lost 1-10% (registers, so occupancy) in the tenth. Batches
// of up to kMaxSplitBatch rows split a unit's columns over warps when it
// has few rows (gemv_bf16_split).
template <int N, bool GATED>
struct VecShape {
  static constexpr int kRows = N == 1 ? (GATED ? 4 : 2) : N < 4 ? 2 : 4;
  static constexpr int kUnroll = N == 1 && GATED ? 1 : 2;
  // Warp units (WarpRows) of a matrix of `rows`.
  static int64_t units(int64_t rows) { return WarpRows<kRows, GATED>::units(rows); }
  // Blocks of the kernel an SM holds (by its registers).
  static int resident() {
    static const int n =
        resident_blocks(reinterpret_cast<const void*>(gemv_bf16_vec<N, kRows, kUnroll, GATED, 1>));
    return n;
  }
  static int split(int64_t rows, int64_t cols) {
    if (N > kMaxSplitBatch || cols % 8 != 0) return 1;
    return column_split_in_waves(units(rows), cols / 8, 16 * kUnroll, resident(), N == 1);
  }
  static GemvLaunchShape shape(int64_t rows, int64_t cols) {
    GemvLaunchShape g;
    g.rows_per_warp = kRows;
    g.split = split(rows, cols);
    g.warps = units(rows) * g.split;
    g.wave_warps = int64_t(resident()) * kWarpsPerBlock * current_launch_limits().multiprocessors;
    return g;
  }
};

template <int N, bool GATED, int SPLIT>
void launch_vec_split(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y,
                      const GemvFusion& f, cudaStream_t stream) {
  using Shape = VecShape<N, GATED>;
  constexpr int kRows = Shape::kRows, kUnroll = Shape::kUnroll;
  constexpr int kUnits = ColumnShare<SPLIT>::kUnitsPerBlock;
  const unsigned blocks = unsigned((Shape::units(rows) + kUnits - 1) / kUnits);
  if constexpr (N <= kGemvPreAddMaxRows) {
    if (f.pre_add) {
      const auto kernel = gemv_bf16_pre_add<N, kRows, kUnroll, GATED, SPLIT>;
      const size_t smem = pre_add_smem_bytes(N, cols);
      if (smem > (size_t(48) << 10))
        allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
      launch(kernel, blocks, kWarpsPerBlock * 32, smem, stream, W, rows, cols, x, y, f);
      return;
    }
  }
  launch(gemv_bf16_vec<N, kRows, kUnroll, GATED, SPLIT>, blocks, kWarpsPerBlock * 32, 0, stream, W,
         rows, cols, x, y, f);
}

template <int N, bool GATED>
void launch_vec(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y,
                const GemvFusion& f, cudaStream_t stream) {
  with_split(VecShape<N, GATED>::split(rows, cols), [&](auto s) {
    constexpr int S = decltype(s)::value;
    if constexpr (S == 1 || N <= kMaxSplitBatch)
      launch_vec_split<N, GATED, S>(W, rows, cols, x, y, f, stream);
  });
}

template <class Wt, bool VEC4>
void launch_any(const Wt* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                const GemvFusion& f, cudaStream_t stream) {
  const bool gated = f.gate != GemvGate::None;
  const int64_t units = gated ? WarpRows<2, true>::units(rows) : rows;
  const unsigned blocks = unsigned((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (gated)
    launch(gemv_any<Wt, VEC4, true>, blocks, kWarpsPerBlock * 32, 0, stream, W, rows, cols, x, n, y,
           f);
  else
    launch(gemv_any<Wt, VEC4, false>, blocks, kWarpsPerBlock * 32, 0, stream, W, rows, cols, x, n,
           y, f);
}

}  // namespace

void gemv_f32(const float* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
              cudaStream_t stream, const GemvFusion& fusion) {
  if (rows <= 0 || n <= 0) return;
  check_fusion(fusion, rows, "gemv_f32");
  const bool vec = cols % 4 == 0 && aligned16(W) && aligned16(x) &&
                   (!fusion.normalize || !fusion.norm_weight || aligned16(fusion.norm_weight));
  if (vec)
    launch_any<float, true>(W, rows, cols, x, n, y, fusion, stream);
  else
    launch_any<float, false>(W, rows, cols, x, n, y, fusion, stream);
  CUDA_CHECK(cudaGetLastError());
}

GemvLaunchShape gemv_bf16_launch_shape(int64_t rows, int64_t cols, int64_t n, bool gated) {
  if (n == 1)
    return gated ? VecShape<1, true>::shape(rows, cols) : VecShape<1, false>::shape(rows, cols);
  if (n == 2)
    return gated ? VecShape<2, true>::shape(rows, cols) : VecShape<2, false>::shape(rows, cols);
  fail("gemv_bf16_launch_shape: batches of 1 and 2 only, got %lld", (long long)n);
}

int gemv_bf16_split(int64_t rows, int64_t cols, int64_t n, bool gated) {
  return n == 1 || n == 2 ? gemv_bf16_launch_shape(rows, cols, n, gated).split : 1;
}

bool gemv_pre_add_fits(int64_t n, int64_t cols) {
  if (n < 1 || n > kGemvPreAddMaxRows) return false;
  return pre_add_smem_bytes(int(n), cols) + pre_add_static_bytes(int(n)) <=
         current_launch_limits().smem_optin;
}

void gemv_bf16(const uint16_t* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream, const GemvFusion& fusion) {
  if (rows <= 0 || n <= 0) return;
  const bool vec = cols % 8 == 0 && aligned16(W) && aligned16(x) &&
                   (!fusion.normalize || !fusion.norm_weight || aligned16(fusion.norm_weight));
  // pre_add: one batch run (its pointers are not offset per run).
  static_assert(kGemvPreAddMaxRows <= kMaxBatch, "a pre_add GEMV is one batch run");
  const bool pre_add_ok = fusion.pre_add && vec && aligned16(fusion.pre_add) &&
                          aligned16(fusion.pre_add_weight) && aligned16(fusion.residual_out) &&
                          gemv_pre_add_fits(n, cols);
  check_fusion(fusion, rows, "gemv_bf16", pre_add_ok);
  if (!vec) {
    launch_any<uint16_t, false>(W, rows, cols, x, n, y, fusion, stream);
    CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t outputs = fusion.gate != GemvGate::None ? rows / 2 : rows;
  for_batch_runs(n, [&](auto run, int64_t t0) {
    constexpr int N = decltype(run)::value;
    const float* xt = x + t0 * cols;
    float* yt = y + t0 * outputs;
    const GemvFusion ft = from_row(fusion, t0);
    if (fusion.gate != GemvGate::None)
      launch_vec<N, true>(W, rows, cols, xt, yt, ft, stream);
    else
      launch_vec<N, false>(W, rows, cols, xt, yt, ft, stream);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
