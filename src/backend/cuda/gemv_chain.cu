// The persistent GEMV chain (gemv_chain.h). Every block loops over the
// phases; in each it takes virtual blocks blockIdx.x, + gridDim.x, ... of
// kWarps warps, each warp one output (a row, or a gate/up pair) or a share
// of its columns (the phase's split, chosen on the host as gemv_bf16's
// column split is); then the grid meets at a barrier before the next phase
// reads what this one wrote.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv_chain.h"
#include "backend/cuda/gemv_fusion.h"

namespace tandem::cuda {

namespace {

constexpr int kWarps = 8;   // warps a block
constexpr int kUnroll = 4;  // 16-byte chunks a row a lane keeps in flight
constexpr int kMostBlocksPerSm = 4;

// A phase as the kernel reads it.
struct Phase {
  const uint4* w;  // rows of `chunks` 16-byte chunks (8 bf16 each)
  const float* x;
  float* y;
  int chunks, outputs, split, gate;  // gate: GemvGate as int
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid waits here until all have arrived; writes made
// before it are visible to every block after it. bar[0] counts arrivals,
// bar[1] is the generation the last arrival advances (the grid is
// co-resident: launched cooperatively).
__device__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned generation = load_acquire(bar + 1);
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (load_acquire(bar + 1) == generation) {
      }
    }
  }
  __syncthreads();
}

// Warp w's work in virtual block vb of a phase: output `out` (valid or
// not; an invalid warp reads the last output's rows and stores nothing),
// columns [first, first + count) in chunks.
struct WarpTask {
  const uint4* w[2];  // the gate (or only) row and the up row, at `first`
  int first, count, out;
  bool valid;
  __device__ WarpTask(const Phase& p, int vb) {
    const int warp = int(threadIdx.x) / 32, s = p.split;
    out = vb * (kWarps / s) + warp / s;
    valid = out < p.outputs;
    const int per = (p.chunks + s - 1) / s, part = warp % s;
    first = min(part * per, p.chunks);
    count = min(first + per, p.chunks) - first;
    const int o = min(out, p.outputs - 1);
    w[0] = p.w + size_t(o) * size_t(p.chunks) + first;
    w[1] = p.gate ? p.w + size_t(p.outputs + o) * size_t(p.chunks) + first : w[0];
  }
  // Chunks i + 32u of the task's rows into v.
  __device__ __forceinline__ void load(int i, bool gated, uint4 (&v)[2][kUnroll]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if ((r == 0 || gated) && i + 32 * u < count) v[r][u] = __ldg(w[r] + i + 32 * u);
  }
  // The same addresses prefetched into L2.
  __device__ __forceinline__ void prefetch_l2(int i, bool gated) const {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if ((r == 0 || gated) && i + 32 * u < count)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(w[r] + i + 32 * u));
  }
};

// The products of a 16-byte weight chunk with its eight activations.
__device__ __forceinline__ float chunk_dot(uint4 v, float4 a, float4 b) {
  float w[8];
  gemv::widen8(v, w);
  return gemv::dot8(w, a, b);
}

__device__ int virtual_blocks(const Phase& p) {
  const int per_block = kWarps / p.split;
  return (p.outputs + per_block - 1) / per_block;
}

// One virtual block of a phase. v holds the task's first chunks when
// `loaded`. The block's warps all call it (the split's gather is a block
// barrier).
__device__ void run_virtual_block(const Phase& p, int vb, bool loaded, uint4 (&v)[2][kUnroll]) {
  __shared__ float parts[kWarps][2];
  const WarpTask t(p, vb);
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const bool gated = p.gate != 0;
  float acc[2] = {0.f, 0.f};
  const float4* x = reinterpret_cast<const float4*>(p.x) + 2 * t.first;
  for (int i = lane; i < t.count; i += 32 * kUnroll) {
    if (i != lane || !loaded) t.load(i, gated, v);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = i + 32 * u;
      if (c >= t.count) break;
      const float4 a = x[2 * c], b = x[2 * c + 1];
      acc[0] += chunk_dot(v[0][u], a, b);
      if (gated) acc[1] += chunk_dot(v[1][u], a, b);
    }
  }
  acc[0] = warp_sum(acc[0]);
  acc[1] = warp_sum(acc[1]);
  if (p.split > 1) {
    __syncthreads();  // parts may still be read for the previous virtual block
    if (lane == 0) parts[warp][0] = acc[0], parts[warp][1] = acc[1];
    __syncthreads();
    if (warp % p.split != 0) return;
    acc[0] = acc[1] = 0.f;
    for (int k = 0; k < p.split; ++k) acc[0] += parts[warp + k][0], acc[1] += parts[warp + k][1];
  }
  if (lane != 0 || !t.valid) return;
  p.y[t.out] = gated ? gate_value(GemvGate(p.gate), acc[0], acc[1]) : acc[0];
}

__global__ void __launch_bounds__(kWarps * 32, 2)
    gemv_chain_kernel(const Phase* __restrict__ phases, int count, int prefetch, unsigned* bar) {
  uint4 v[2][kUnroll];
  bool loaded = false;
  for (int k = 0; k < count; ++k) {
    const Phase p = phases[k];
    const int blocks = virtual_blocks(p);
    for (int vb = int(blockIdx.x); vb < blocks; vb += int(gridDim.x)) {
      run_virtual_block(p, vb, loaded && vb == int(blockIdx.x), v);
    }
    loaded = false;
    if (k + 1 == count) break;
    // The next phase's first weights go out before the barrier: they are
    // never written, so only the activations must wait for it.
    const Phase next = phases[k + 1];
    if (prefetch != 0 && int(blockIdx.x) < virtual_blocks(next)) {
      const WarpTask t(next, int(blockIdx.x));
      const int lane = int(threadIdx.x) % 32;
      if (prefetch == int(ChainPrefetch::L2)) {
        t.prefetch_l2(lane, next.gate != 0);
      } else {
        t.load(lane, next.gate != 0, v);
        loaded = true;
      }
    }
    grid_barrier(bar);
  }
}

}  // namespace

GemvChain::GemvChain(std::vector<GemvChainPhase> phases, int blocks_per_sm) {
  const LaunchLimits limits = current_launch_limits();
  if (limits.multiprocessors == 0) fail("gemv chain: no usable CUDA device");
  int fit = 0;
  CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, gemv_chain_kernel, kWarps * 32, 0));
  fit = std::min(fit, kMostBlocksPerSm);
  if (blocks_per_sm <= 0) blocks_per_sm = fit;
  if (blocks_per_sm > fit)
    fail("gemv chain: %d blocks an SM asked, the kernel's registers allow %d", blocks_per_sm, fit);
  blocks_ = blocks_per_sm * limits.multiprocessors;
  const int64_t warps = int64_t(blocks_) * kWarps;
  std::vector<Phase> table;
  for (size_t i = 0; i < phases.size(); ++i) {
    const GemvChainPhase& g = phases[i];
    const bool gated = g.gate != GemvGate::None;
    if (!g.w || !g.x || !g.y || g.rows <= 0 || g.cols <= 0 || g.cols % 8 != 0 ||
        (gated && g.rows % 2 != 0) || reinterpret_cast<uintptr_t>(g.w) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(g.x) % 16 != 0 || g.rows > INT32_MAX || g.cols > INT32_MAX)
      fail(
          "gemv chain: phase %zu (%lld x %lld%s) needs weights, x and y, 16-byte aligned W and "
          "x, cols a multiple of 8 and an even row count when gated",
          i, (long long)g.rows, (long long)g.cols, gated ? ", gated" : "");
    Phase p{};
    p.w = reinterpret_cast<const uint4*>(g.w);
    p.x = g.x;
    p.y = g.y;
    p.chunks = int(g.cols / 8);
    p.outputs = int(gated ? g.rows / 2 : g.rows);
    p.gate = int(g.gate);
    // As gemv_bf16's split: more warps a unit while the units leave warps
    // idle, each keeping at least a chunk a lane.
    p.split = 1;
    while (p.split < kWarps && int64_t(p.outputs) * p.split < warps &&
           p.chunks / (2 * p.split) >= 32)
      p.split *= 2;
    table.push_back(p);
    weight_bytes_ += size_t(g.rows * g.cols) * 2;
  }
  phases_ = int(table.size());
  table_ = DeviceBuffer(std::max<size_t>(1, table.size()) * sizeof(Phase));
  if (!table.empty()) table_.upload(table.data(), table.size() * sizeof(Phase));
  barrier_ = DeviceBuffer(2 * sizeof(unsigned));
  CUDA_CHECK(cudaMemset(barrier_.get(), 0, 2 * sizeof(unsigned)));
}

void GemvChain::run(cudaStream_t stream, ChainPrefetch prefetch) {
  if (phases_ == 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks_));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_chain_kernel, table_.as<const Phase>(), phases_,
                                int(prefetch), barrier_.as<unsigned>()));
}

}  // namespace tandem::cuda
