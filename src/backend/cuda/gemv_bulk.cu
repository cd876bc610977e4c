// EXPERIMENT (session 42; TANDEM_CUDA_GEMV_BULK=1, off by default, sm_90):
// the batch-1 bf16 GEMV fed through shared memory by bulk copies.
//
// Why: gemv.cu's kernel streams weights through registers, one round of
// loads a warp in flight, and its blocks fill an SM's registers, so the next
// kernel's blocks start only as they exit. Matrices of one wave or less
// stream at 65-80% of the copy bandwidth in a chain of launches
// (bench_cuda_kernels on the H100: gemma-3-1b's down 65%, gate/up 78%)
// against 96-102% for the head's 31 waves: the ramp and the tail of every
// launch cost 2-3 µs. Here one block an SM (8 consumer warps and a producer
// warp, few registers) owns a contiguous range of outputs; the producer
// thread copies tiles of their weight rows into a ring of shared-memory
// stages from the kernel's first instruction (weights need no PDL wait), so
// a ring of bytes an SM is on its way during the previous kernel's tail,
// and the next kernel's blocks fit beside this one's.
// UNFINISHED: written without a GPU (no machine started after session 42's
// first call); its test (CudaKernels.GemvBulkMatchesTheUnfusedMath) and
// its measurement against gemv.cu's kernel have not run. Until they have,
// nothing turns it on by default.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv_fusion.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

using namespace gemv;

constexpr int kBulkConsumers = 8;                        // consumer warps a block
constexpr int kBulkThreads = (kBulkConsumers + 1) * 32;  // and one producer warp
constexpr int64_t kBulkTileBytes = 16 << 10;             // a tile's target size
constexpr int64_t kBulkMaxSumBytes = 32 << 10;           // a block's output sums

// How a launch cuts the matrix. A block owns outputs [o0, o1) (the grid's
// even shares); a tile holds `tile_outputs` of them (gate and up rows when
// gated) over `range_cols` columns, and `ranges` tiles cover a row.
struct BulkPlan {
  int64_t outputs = 0;        // rows, or rows / 2 gated
  int tile_outputs = 1;       // 1, 2, 4 or 8
  int range_cols = 0;         // a multiple of 8
  int ranges = 1;             //
  int stages = 2;             // tiles the ring holds
  int outputs_per_block = 0;  // the most a block owns
  uint32_t tile_bytes = 0;    // tile_outputs · (1 or 2) · range_cols · 2
};

// Shared memory: the ring (stages · tile_bytes), a full and an empty
// barrier a stage, the output sums ([1 or 2][outputs_per_block]), and with
// pre_add the staged input (3 · cols floats: x, then h' · norm_weight; the
// pre_add term; the norm weight) and the consumers' partial sums.
size_t bulk_sums_bytes(const BulkPlan& p, bool gated) {
  return size_t(gated ? 2 : 1) * size_t(p.outputs_per_block) * sizeof(float);
}
size_t bulk_smem_bytes(const BulkPlan& p, bool gated, bool pre_add, int64_t cols) {
  return size_t(p.stages) * p.tile_bytes + size_t(2 * p.stages) * sizeof(uint64_t) +
         bulk_sums_bytes(p, gated) +
         (pre_add ? size_t(3 * cols + 4 * kBulkConsumers) * sizeof(float) : 0);
}

// GemvFusion::pre_add for the consumer warps (gemv.cu's gemv_bf16_pre_add
// prologue at batch 1, over 256 threads): stages h' · norm_weight, h' = (x
// + s1 · pre_add · pre_add_weight) · pre_add_scale, in `staged` (3 · cols
// floats), writes this block's share of h' to residual_out, and returns the
// input norm's scale s2 (1 without normalize). Ends with a consumer barrier.
__device__ float bulk_pre_add(const float* x, int64_t cols, const GemvFusion& f, float* staged,
                              float* partial) {
  constexpr int kThreads = kBulkConsumers * 32;
  float* hs = staged;
  float* us = staged + cols;
  float* gs = staged + 2 * cols;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  float oo = 0.f, xx = 0.f, xu = 0.f, uu = 0.f;
  const int64_t quads = cols / 4;
  for (int64_t i = threadIdx.x; i < quads; i += kThreads) {
    const float4 pw = __ldg(reinterpret_cast<const float4*>(f.pre_add_weight) + i);
    const float4 g = f.normalize && f.norm_weight
                         ? __ldg(reinterpret_cast<const float4*>(f.norm_weight) + i)
                         : make_float4(1.f, 1.f, 1.f, 1.f);
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    const float4 o = reinterpret_cast<const float4*>(f.pre_add)[i];
    const float4 u = make_float4(o.x * pw.x, o.y * pw.y, o.z * pw.z, o.w * pw.w);
    reinterpret_cast<float4*>(gs)[i] = g;
    reinterpret_cast<float4*>(hs)[i] = a;
    reinterpret_cast<float4*>(us)[i] = u;
    oo += o.x * o.x + o.y * o.y + o.z * o.z + o.w * o.w;
    xx += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    xu += a.x * u.x + a.y * u.y + a.z * u.z + a.w * u.w;
    uu += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
  }
  oo = warp_sum(oo), xx = warp_sum(xx), xu = warp_sum(xu), uu = warp_sum(uu);
  if (lane == 0) {
    partial[4 * warp] = oo, partial[4 * warp + 1] = xx;
    partial[4 * warp + 2] = xu, partial[4 * warp + 3] = uu;
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  oo = xx = xu = uu = 0.f;
#pragma unroll
  for (int w = 0; w < kBulkConsumers; ++w) {
    oo += partial[4 * w], xx += partial[4 * w + 1];
    xu += partial[4 * w + 2], uu += partial[4 * w + 3];
  }
  const float s1 = inv_rms(oo, cols, f.norm_eps);
  const float k = f.pre_add_scale;
  const float s2 = f.normalize ? inv_rms(fmaxf(k * k * (xx + 2.f * s1 * xu + s1 * s1 * uu), 0.f),
                                         cols, f.norm_eps)
                               : 1.f;
  for (int64_t i = threadIdx.x; i < quads; i += kThreads) {
    const float4 a = reinterpret_cast<const float4*>(hs)[i];
    const float4 u = reinterpret_cast<const float4*>(us)[i];
    const float4 g = reinterpret_cast<const float4*>(gs)[i];
    const float4 h = make_float4((a.x + s1 * u.x) * k, (a.y + s1 * u.y) * k, (a.z + s1 * u.z) * k,
                                 (a.w + s1 * u.w) * k);
    if (i % gridDim.x == blockIdx.x) reinterpret_cast<float4*>(f.residual_out)[i] = h;
    reinterpret_cast<float4*>(hs)[i] = make_float4(h.x * g.x, h.y * g.y, h.z * g.z, h.w * g.w);
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  return s2;
}

// A stage's tile k: full[s] completes when its copies land (the producer
// arms it with their bytes); empty[s] when the 8 consumer warps have read
// it. Each consumer warp takes one output of the tile and a 1 / Q share of
// its columns (Q = 8 / tile_outputs warps an output), reduces its partial
// dot products and adds them to the block's sums in shared memory; after
// the last tile the consumers write the outputs with the fusion's epilogue.
template <bool GATED, bool PRE_ADD>
__global__ void __launch_bounds__(kBulkThreads, 2)
    gemv_bf16_bulk_kernel(const uint16_t* __restrict__ W, int64_t cols, const float* x, float* y,
                          GemvFusion f, BulkPlan plan) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int R = GATED ? 2 : 1;  // weight rows an output reads
  extern __shared__ __align__(128) uint8_t smem[];
  const int S = plan.stages, U = plan.tile_outputs, CW = plan.range_cols;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(S) * plan.tile_bytes);
  uint64_t* empty = full + S;
  float* sums = reinterpret_cast<float*>(empty + S);
  float* staged = sums + R * plan.outputs_per_block;  // PRE_ADD: 3 · cols floats
  float* partial = staged + 3 * cols;                 // PRE_ADD: 4 a consumer warp
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t O = plan.outputs;
  const int64_t o0 = int64_t(blockIdx.x) * O / gridDim.x;
  const int64_t o1 = int64_t(blockIdx.x + 1) * O / gridDim.x;
  const int64_t tiles = (o1 - o0 + U - 1) / U * plan.ranges;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbarrier_init(full + s);
      mbarrier_init(empty + s, kBulkConsumers);
    }
  }
  for (int i = int(threadIdx.x); i < R * plan.outputs_per_block; i += kBulkThreads) sums[i] = 0.f;
  __syncthreads();

  if (warp == kBulkConsumers) {  // the producer: weights only, no PDL wait
    if (lane != 0) return;
    for (int64_t k = 0; k < tiles; ++k) {
      const int s = int(k % S);
      if (k >= S) {
        mbarrier_wait(empty + s, uint32_t((k / S - 1) & 1));
        fence_async_shared();
      }
      const int64_t first = o0 + (k / plan.ranges) * U;
      const int n = int(min(int64_t(U), o1 - first));
      const int64_t c0 = (k % plan.ranges) * CW;
      const int len = int(min(int64_t(CW), cols - c0));
      uint8_t* slot = smem + size_t(s) * plan.tile_bytes;
      mbarrier_expect_tx(full + s, uint32_t(n * R * len * 2));
      for (int u = 0; u < n; ++u)
#pragma unroll
        for (int h = 0; h < R; ++h)
          bulk_copy(slot + size_t(u * R + h) * CW * 2, W + (h * O + first + u) * cols + c0,
                    uint32_t(len * 2), full + s);
    }
    return;
  }

  pdl_wait();
  float scale = 1.f;
  const float* xin = x;  // the input the dot products take
  if constexpr (PRE_ADD) {
    scale = bulk_pre_add(x, cols, f, staged, partial);
    xin = staged;
  } else if (f.normalize) {
    float ss = 0.f;
    for (int64_t i = lane; i < cols / 4; i += 32) {
      const float4 a = reinterpret_cast<const float4*>(x)[i];
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    scale = inv_rms(warp_sum(ss), cols, f.norm_eps);
  }
  const float* g = !PRE_ADD && f.normalize ? f.norm_weight : nullptr;
  const int Q = kBulkConsumers / U;
  const int u = warp / Q, q = warp % Q;
  for (int64_t k = 0; k < tiles; ++k) {
    const int s = int(k % S);
    const int64_t o = o0 + (k / plan.ranges) * U + u;
    const int64_t c0 = (k % plan.ranges) * CW;
    const int chunks = int(min(int64_t(CW), cols - c0)) / 8;
    mbarrier_wait(full + s, uint32_t((k / S) & 1));
    float acc[R];
#pragma unroll
    for (int h = 0; h < R; ++h) acc[h] = 0.f;
    if (o < o1) {
      const uint4* rows = reinterpret_cast<const uint4*>(smem + size_t(s) * plan.tile_bytes +
                                                         size_t(u * R) * CW * 2);
      for (int c = q * 32 + lane; c < chunks; c += 32 * Q) {
        const float* xc = xin + c0 + int64_t(c) * 8;
        float4 a = reinterpret_cast<const float4*>(xc)[0],
               b = reinterpret_cast<const float4*>(xc)[1];
        if (g) {
          const float4 ga = __ldg(reinterpret_cast<const float4*>(g + c0 + int64_t(c) * 8));
          const float4 gb = __ldg(reinterpret_cast<const float4*>(g + c0 + int64_t(c) * 8) + 1);
          a = make_float4(a.x * ga.x, a.y * ga.y, a.z * ga.z, a.w * ga.w);
          b = make_float4(b.x * gb.x, b.y * gb.y, b.z * gb.z, b.w * gb.w);
        }
#pragma unroll
        for (int h = 0; h < R; ++h) {
          float w[8];
          widen8(rows[h * (CW / 8) + c], w);
          acc[h] += dot8(w, a, b);
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty + s);  // release: the reads above are done
    if (o < o1) {
#pragma unroll
      for (int h = 0; h < R; ++h) {
        const float v = warp_sum(acc[h]);
        if (lane == 0) atomicAdd(sums + h * plan.outputs_per_block + (o - o0), v);
      }
    }
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kBulkConsumers * 32) : "memory");  // consumers only
  for (int64_t i = threadIdx.x; i < o1 - o0; i += kBulkConsumers * 32) {
    const int64_t o = o0 + i;
    const float v = sums[i] * scale + (f.bias ? f.bias[o] : 0.f);
    if constexpr (GATED) {
      const float up = sums[plan.outputs_per_block + i] * scale + (f.bias ? f.bias[O + o] : 0.f);
      y[o] = gate_value(f.gate, v, up);
    } else if (f.times) {
      y[o] = gate_value(f.times_act, v, f.times[o]);
    } else {
      y[o] = f.accumulate ? y[o] + v : v;
    }
  }
#else
  __trap();  // the host launches it on sm_90+ only
#endif
}

// The ring's bytes an SM (TANDEM_CUDA_GEMV_BULK_KB, default 64: beside the
// chunked attention's 159 KB at head dim 256).
int64_t bulk_ring_bytes() {
  static const int64_t kb = std::clamp<int64_t>(env_count("TANDEM_CUDA_GEMV_BULK_KB", 64), 16, 192);
  return kb << 10;
}

BulkPlan bulk_plan(int64_t rows, int64_t cols, bool gated, int grid) {
  BulkPlan p;
  const int R = gated ? 2 : 1;
  p.outputs = gated ? rows / 2 : rows;
  const int64_t output_bytes = int64_t(R) * cols * 2;
  if (2 * output_bytes > kBulkTileBytes) {  // long rows: one output a tile, in ranges
    p.ranges = int((output_bytes + kBulkTileBytes - 1) / kBulkTileBytes);
  } else {
    while (p.tile_outputs < kBulkConsumers && 2 * p.tile_outputs * output_bytes <= kBulkTileBytes)
      p.tile_outputs *= 2;
  }
  const int64_t chunks = cols / 8;
  p.range_cols = int((chunks + p.ranges - 1) / p.ranges * 8);
  p.tile_bytes = uint32_t(int64_t(p.tile_outputs) * R * p.range_cols * 2);
  p.stages = int(std::clamp<int64_t>(bulk_ring_bytes() / p.tile_bytes, 2, 8));
  // A multiple of 4, so the staged pre_add input after the sums is 16-byte aligned.
  p.outputs_per_block = int(((p.outputs + grid - 1) / grid + 3) / 4 * 4);
  return p;
}

}  // namespace

bool gemv_bf16_bulk_wanted(int64_t rows, int64_t cols) {
  static const bool on = env_is("TANDEM_CUDA_GEMV_BULK", "1");
  // Matrices below this many MB keep gemv.cu's kernel (0: none do): the
  // bulk blocks cannot sit beside the chunked attention's 160-220 KB of
  // shared memory, so the o projection's blocks on those SMs start late.
  static const int64_t min_mb = env_count("TANDEM_CUDA_GEMV_BULK_MIN_MB", 0);
  return on && current_launch_limits().cc_major >= 9 && rows * cols * 2 >= (min_mb << 20);
}

bool gemv_bf16_bulk_fits(int64_t rows, int64_t cols, const float* x, const GemvFusion& f) {
  const LaunchLimits lim = current_launch_limits();
  if (lim.cc_major < 9 || lim.multiprocessors <= 0 || rows <= 0 || cols % 8 != 0 || !aligned16(x))
    return false;
  if (f.quantized_in || f.quantized_out) return false;
  if (f.normalize && f.norm_weight && !aligned16(f.norm_weight)) return false;
  if (f.pre_add && (!aligned16(f.pre_add) || !aligned16(f.pre_add_weight) ||
                    !aligned16(f.residual_out) || !f.residual_out))
    return false;
  const bool gated = f.gate != GemvGate::None;
  if (gated && rows % 2 != 0) return false;
  const BulkPlan p = bulk_plan(rows, cols, gated, lim.multiprocessors);
  if (bulk_sums_bytes(p, gated) > kBulkMaxSumBytes) return false;
  return bulk_smem_bytes(p, gated, f.pre_add != nullptr, cols) <= lim.smem_optin;
}

void gemv_bf16_bulk(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y,
                    cudaStream_t stream, const GemvFusion& f) {
  check_fusion(f, rows, "gemv_bf16_bulk", true);
  if (!aligned16(W) || !gemv_bf16_bulk_fits(rows, cols, x, f))
    fail(
        "gemv_bf16_bulk: %lld x %lld does not fit the bulk GEMV (sm_90, cols %% 8 == 0, "
        "16-byte aligned operands, no quantized rows)",
        (long long)rows, (long long)cols);
  const bool gated = f.gate != GemvGate::None;
  const int grid = current_launch_limits().multiprocessors;
  const BulkPlan p = bulk_plan(rows, cols, gated, grid);
  const bool pre_add = f.pre_add != nullptr;
  const size_t smem = bulk_smem_bytes(p, gated, pre_add, cols);
  const auto kernel =
      gated ? (pre_add ? gemv_bf16_bulk_kernel<true, true> : gemv_bf16_bulk_kernel<true, false>)
            : (pre_add ? gemv_bf16_bulk_kernel<false, true> : gemv_bf16_bulk_kernel<false, false>);
  if (smem > (size_t(48) << 10)) allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
  launch(kernel, unsigned(grid), kBulkThreads, smem, stream, W, cols, x, y, f, p);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
