// What the decode GEMV kernels (gemv.cu, quant.cu) share: which weight rows
// a warp streams, the fused epilogue of GemvFusion, and the split of a
// batch into runs of up to 8 rows. Included only by .cu files.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/activations.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.h"

namespace tandem::cuda::gemv {

constexpr int kWarpsPerBlock = 8;
// Blocks an SM must hold of the bf16 GEMVs over N batch rows (their launch
// bounds): 4 at batch 1, so registers stay at 64 a thread (32 warps an SM
// instead of the 24 that 66 left; figures at column_split_in_waves); 3 at
// batch 2, which is what 72-80 registers gave before the bounds (a bound of 1
// let them grow to 86-96, two blocks, and cost 5-9% at batch 2); 1 beyond.
constexpr int gemv_min_blocks(int n) {
  return n == 1 ? 4 : n == 2 ? 3 : 1;
}
constexpr int kMaxBatch = 8;  // batch rows a kernel keeps in registers
// Batches of up to this many rows may split columns over warps (ColumnShare;
// the decoder's GEMV steps over bf16 weights); larger ones do not, which
// keeps the number of kernels to build down.
constexpr int kMaxSplitBatch = 2;

// The ROWS weight rows of warp `unit`. Plain: rows unit·ROWS + r. Gated
// (ROWS even): ROWS/2 gate rows and the up rows that pair with them, so one
// warp holds both inputs of each output. Rows past the end are clamped to
// the last valid one: read, never stored.
template <int ROWS, bool GATED>
struct WarpRows {
  static_assert(!GATED || ROWS % 2 == 0, "a gated warp holds whole gate/up pairs");
  static constexpr int kOutputs = GATED ? ROWS / 2 : ROWS;  // outputs per warp
  int64_t first;                                            // the warp's first output index
  int64_t outputs;  // output rows in all: rows, or rows / 2 gated

  __device__ WarpRows(int64_t unit, int64_t rows)
      : first(unit * kOutputs), outputs(GATED ? rows / 2 : rows) {}
  __device__ bool any() const { return first < outputs; }
  __device__ int64_t row(int r) const {
    const int64_t o = first + (r % kOutputs);
    const int64_t c = o < outputs ? o : outputs - 1;
    return GATED && r >= kOutputs ? outputs + c : c;
  }
  __host__ __device__ static int64_t units(int64_t rows) {
    const int64_t outs = GATED ? rows / 2 : rows;
    return (outs + kOutputs - 1) / kOutputs;
  }
};

// A warp's partial sums, zeroed: acc[r][t] (row r, batch row t) and the
// sums of squares ss[t] of a normalized input.
template <int N, int ROWS>
__device__ __forceinline__ void zero_sums(float (&acc)[ROWS][N], float (&ss)[N]) {
#pragma unroll
  for (int t = 0; t < N; ++t) {
    ss[t] = 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][t] = 0.f;
  }
}

// 1 / RMS of a batch row from its sum of squares (the norm's scale).
__device__ __forceinline__ float inv_rms(float sum_sq, int64_t cols, float eps) {
  return rsqrtf(sum_sq / float(cols) + eps);
}

// bf16 weights widened to f32 (the low and high halves of a word), eight
// from a 16-byte chunk, and their dot product with eight activations.
__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ void widen8(const uint4& v, float (&w)[8]) {
  w[0] = bf16_lo(v.x), w[1] = bf16_hi(v.x), w[2] = bf16_lo(v.y), w[3] = bf16_hi(v.y);
  w[4] = bf16_lo(v.z), w[5] = bf16_hi(v.z), w[6] = bf16_lo(v.w), w[7] = bf16_hi(v.w);
}
__device__ __forceinline__ float dot8(const float (&w)[8], float4 a, float4 b) {
  return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z +
         w[7] * b.w;
}

// Output r of batch row t of a gated warp: act(gate) · up, each with its
// bias, from the reduced sums of the gate row (acc[r]) and its up row
// (acc[r + kOutputs]).
template <int N, int ROWS>
__device__ __forceinline__ float gated_output(const WarpRows<ROWS, true>& wr,
                                              const float (&acc)[ROWS][N], int r, int t,
                                              const GemvFusion& f) {
  constexpr int kOut = WarpRows<ROWS, true>::kOutputs;
  const int64_t o = wr.first + r, up = wr.outputs + o;
  const float g = acc[r][t] + (f.bias ? f.bias[o] : 0.f);
  const float u = acc[r + kOut][t] + (f.bias ? f.bias[up] : 0.f);
  return gate_value(f.gate, g, u);
}

// The epilogue: reduces the warp's partial sums acc[r][t] (and, when
// normalizing, the per-lane sums of squares ss[t] of x), then lane 0
// writes the warp's outputs as GemvFusion says. Every lane must call it.
template <int N, int ROWS, bool GATED>
__device__ __forceinline__ void finish(const WarpRows<ROWS, GATED>& wr, float (&acc)[ROWS][N],
                                       float (&ss)[N], int64_t cols, const GemvFusion& f,
                                       float* y) {
  float scale[N];
#pragma unroll
  for (int t = 0; t < N; ++t)
    scale[t] = f.normalize ? inv_rms(warp_sum(ss[t]), cols, f.norm_eps) : 1.f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = warp_sum(acc[r][t]) * scale[t];
  if (threadIdx.x % 32 != 0) return;
  constexpr int kOut = WarpRows<ROWS, GATED>::kOutputs;
#pragma unroll
  for (int r = 0; r < kOut; ++r) {
    const int64_t o = wr.first + r;
    if (o >= wr.outputs) break;
#pragma unroll
    for (int t = 0; t < N; ++t) {
      float* dst = y + t * wr.outputs + o;
      if constexpr (GATED) {
        *dst = gated_output(wr, acc, r, t, f);
      } else {
        const float v = acc[r][t] + (f.bias ? f.bias[o] : 0.f);
        if (f.times)
          *dst = gate_value(f.times_act, v, f.times[t * f.times_stride + o]);
        else
          *dst = f.accumulate ? *dst + v : v;
      }
    }
  }
}

// The fusion as seen by a launch (or a finish call) whose batch row 0 is
// row t0 of the call: the per-row vectors (times) offset to it.
__host__ __device__ inline GemvFusion from_row(const GemvFusion& f, int64_t t0) {
  GemvFusion g = f;
  if (g.times) g.times += t0 * g.times_stride;
  return g;
}

// Column split: SPLIT warps of a block (1, 2, 4 or 8) share one unit's rows,
// each streaming a contiguous share of the columns, so a matrix with few
// rows still puts enough warps (and loads in flight) on every SM. A block
// holds kWarpsPerBlock / SPLIT units; warp w takes share w % SPLIT.
template <int SPLIT>
struct ColumnShare {
  static_assert(SPLIT >= 1 && kWarpsPerBlock % SPLIT == 0, "SPLIT divides a block's warps");
  static constexpr int kUnitsPerBlock = kWarpsPerBlock / SPLIT;
  int64_t first, count;  // the warp's share: `count` chunks from chunk `first`

  __device__ explicit ColumnShare(int64_t chunks) {
    const int64_t part = (threadIdx.x / 32) % SPLIT, per = (chunks + SPLIT - 1) / SPLIT;
    first = part * per < chunks ? part * per : chunks;
    count = (first + per < chunks ? first + per : chunks) - first;
  }
  __device__ static int64_t unit() {
    return int64_t(blockIdx.x) * kUnitsPerBlock + (threadIdx.x / 32) / SPLIT;
  }
};

// Gathers the SPLIT warps' partial sums of a unit into its first warp (in
// lane 0; the other lanes' are zeroed, so finish's warp sums stay right).
// Returns whether this warp holds them (and must call finish). Every warp
// of the block must call it (a block barrier); with SPLIT 1 it is a no-op.
template <int N, int ROWS, int SPLIT>
__device__ __forceinline__ bool gather_split(float (&acc)[ROWS][N], float (&ss)[N]) {
  if constexpr (SPLIT == 1) {
    return true;
  } else {
    constexpr int kSums = ROWS * N + N;
    __shared__ float parts[kWarpsPerBlock][kSums];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const float v = warp_sum(acc[r][t]);
        if (lane == 0) parts[warp][r * N + t] = v;
      }
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const float v = warp_sum(ss[t]);
      if (lane == 0) parts[warp][ROWS * N + t] = v;
    }
    __syncthreads();
    if (warp % SPLIT != 0) return false;
    float total[kSums];
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      total[k] = 0.f;
#pragma unroll
      for (int p = 0; p < SPLIT; ++p) total[k] += parts[warp + p][k];
      if (lane != 0) total[k] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int t = 0; t < N; ++t) acc[r][t] = total[r * N + t];
#pragma unroll
    for (int t = 0; t < N; ++t) ss[t] = total[ROWS * N + t];
    return true;
  }
}

// Blocks of a GEMV kernel (kWarpsPerBlock warps, no dynamic shared memory)
// one SM holds at once, by its registers; at least 1. Host side.
int resident_blocks(const void* kernel);

// The column split for `units` warp units over rows of `chunks` loads: the
// smallest power of two (at most 8) that gives the device's SMs
// TANDEM_CUDA_GEMV_WARPS warps each (default 16: with the packed kernel's 4
// blocks of 8 warps an SM, the largest split within one wave; 0: never
// split), keeping at least `min_chunks` loads a warp. The packed GEMV's.
// Host side.
int column_split(int64_t units, int64_t chunks, int64_t min_chunks);
// The bf16 GEMV's (batches 1 and 2): the largest power of two (at most 8)
// whose warps fit in one wave of `blocks_per_sm` blocks on every SM
// (TANDEM_CUDA_GEMV_WAVES, in percent: default 100; 0 never splits),
// keeping at least `min_chunks` loads a warp: more warps put more loads in
// flight, but past a wave the last blocks run on a device that has mostly
// finished. With `past_wave` (batch 1), units between one wave and two are
// split into column shares of at least 96 loads, which shortens the tail
// their second wave leaves. Host side.
int column_split_in_waves(int64_t units, int64_t chunks, int64_t min_chunks, int blocks_per_sm,
                          bool past_wave);

// Calls run(std::integral_constant<int, SPLIT>{}) for split 1, 2, 4 or 8.
template <class Run>
void with_split(int split, Run&& run) {
  switch (split) {
    case 8: run(std::integral_constant<int, 8>{}); break;
    case 4: run(std::integral_constant<int, 4>{}); break;
    case 2: run(std::integral_constant<int, 2>{}); break;
    default: run(std::integral_constant<int, 1>{}); break;
  }
}

// Calls run(std::integral_constant<int, N>{}, t0) for each run of up to
// kMaxBatch batch rows starting at t0 (N: the run's length, a template
// argument so the kernel keeps the run's activations in registers).
template <class Run>
void for_batch_runs(int64_t n, Run&& run) {
  for (int64_t t0 = 0; t0 < n; t0 += kMaxBatch) {
    switch (n - t0 < kMaxBatch ? n - t0 : kMaxBatch) {
      case 1: run(std::integral_constant<int, 1>{}, t0); break;
      case 2: run(std::integral_constant<int, 2>{}, t0); break;
      case 3: run(std::integral_constant<int, 3>{}, t0); break;
      case 4: run(std::integral_constant<int, 4>{}, t0); break;
      case 5: run(std::integral_constant<int, 5>{}, t0); break;
      case 6: run(std::integral_constant<int, 6>{}, t0); break;
      case 7: run(std::integral_constant<int, 7>{}, t0); break;
      default: run(std::integral_constant<int, 8>{}, t0); break;
    }
  }
}

// The host-side checks every GEMV entry point makes of a fusion;
// pre_add_ok: whether this call can do GemvFusion::pre_add; quantized_ok:
// quantized_out and quantized_in (gemv_affine checks their shapes itself).
void check_fusion(const GemvFusion& f, int64_t rows, const char* what, bool pre_add_ok = false,
                  bool quantized_ok = false);

}  // namespace tandem::cuda::gemv
