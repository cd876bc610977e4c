// Decode GEMV over bf16 and f32 weights: the kernel that decides batch-1
// decode speed, since it streams every weight once per step. The fusions of
// GemvFusion (input norm, bias, residual add, gated MLP) ride in its loop
// and epilogue (gemv_fusion.h).
#include "backend/cuda/check.h"
#include "backend/cuda/gemv_fusion.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace tandem::cuda {

namespace gemv {

void check_fusion(const GemvFusion& f, int64_t rows, const char* what) {
  if (f.accumulate && f.gate != GemvGate::None)
    fail("%s: a gated GEMV cannot also accumulate into its output", what);
  if (f.gate != GemvGate::None && rows % 2 != 0)
    fail("%s: a gated GEMV needs gate and up rows (an even count), got %lld rows", what,
         (long long)rows);
}

}  // namespace gemv

namespace {

using namespace gemv;

__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

// The products of the 8-column chunk at column c: the warp's ROWS weight
// chunks `wv` against every batch row's activations, each loaded once for
// all rows. When normalizing, it also sums each batch row's squares and
// applies the norm weight (the 1 / RMS scale comes in the epilogue).
template <int N, int ROWS>
__device__ __forceinline__ void chunk8(const uint4 (&wv)[ROWS], const float* __restrict__ x,
                                       int64_t cols, int64_t c, const GemvFusion& f,
                                       float (&acc)[ROWS][N], float (&ss)[N]) {
  float w[ROWS][8];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    w[r][0] = bf16_lo(wv[r].x), w[r][1] = bf16_hi(wv[r].x), w[r][2] = bf16_lo(wv[r].y);
    w[r][3] = bf16_hi(wv[r].y), w[r][4] = bf16_lo(wv[r].z), w[r][5] = bf16_hi(wv[r].z);
    w[r][6] = bf16_lo(wv[r].w), w[r][7] = bf16_hi(wv[r].w);
  }
  float4 ga = make_float4(1.f, 1.f, 1.f, 1.f), gb = ga;
  if (f.normalize && f.norm_weight) {
    ga = __ldg(reinterpret_cast<const float4*>(f.norm_weight + c));
    gb = __ldg(reinterpret_cast<const float4*>(f.norm_weight + c) + 1);
  }
#pragma unroll
  for (int t = 0; t < N; ++t) {
    const float4* xp = reinterpret_cast<const float4*>(x + t * cols + c);
    float4 a = __ldg(xp), b = __ldg(xp + 1);
    if (f.normalize) {
      ss[t] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z +
               b.w * b.w;
      a.x *= ga.x, a.y *= ga.y, a.z *= ga.z, a.w *= ga.w;
      b.x *= gb.x, b.y *= gb.y, b.z *= gb.z, b.w *= gb.w;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      acc[r][t] += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w + w[r][4] * b.x +
                   w[r][5] * b.y + w[r][6] * b.z + w[r][7] * b.w;
  }
}

// cols % 8 == 0: 16-byte loads. Each warp owns ROWS rows (WarpRows) and
// reuses every activation chunk it loads for all of them; UNROLL chunks per
// row are in flight at once (memory-level parallelism is what a GEMV needs
// to reach HBM bandwidth).
template <int N, int ROWS, int UNROLL, bool GATED>
__global__ void gemv_bf16_vec(const uint16_t* __restrict__ W, int64_t rows, int64_t cols,
                              const float* __restrict__ x, float* y, GemvFusion f) {
  const WarpRows<ROWS, GATED> wr(int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32, rows);
  const int lane = threadIdx.x % 32;
  if (!wr.any()) return;
  const int64_t chunks = cols / 8;
  const uint4* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) w[r] = reinterpret_cast<const uint4*>(W + wr.row(r) * cols);
  float acc[ROWS][N], ss[N];
#pragma unroll
  for (int t = 0; t < N; ++t) {
    ss[t] = 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][t] = 0.f;
  }
  // The first weight loads go out before waiting for the previous kernel
  // (PDL: weights are never written), so they overlap its tail.
  pdl_launch_dependents();
  int64_t i = lane;
  uint4 v[ROWS][UNROLL];
  if (i + 32 * (UNROLL - 1) < chunks) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[r][u] = __ldg(w[r] + i + 32 * u);
  }
  pdl_wait();
  for (; i + 32 * (UNROLL - 1) < chunks; i += 32 * UNROLL) {
    if (i != lane) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[r][u] = __ldg(w[r] + i + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      uint4 wv[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) wv[r] = v[r][u];
      chunk8<N, ROWS>(wv, x, cols, (i + 32 * u) * 8, f, acc, ss);
    }
  }
  for (; i < chunks; i += 32) {
    uint4 wv[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wv[r] = __ldg(w[r] + i);
    chunk8<N, ROWS>(wv, x, cols, i * 8, f, acc, ss);
  }
  finish<N, ROWS, GATED>(wr, acc, ss, cols, f, y);
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
__global__ void gemv_any(const Wt* __restrict__ W, int64_t rows, int64_t cols,
                         const float* __restrict__ x, int64_t n, float* y, GemvFusion f) {
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
        float4 a = __ldg(reinterpret_cast<const float4*>(xt) + c);
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
    finish<1, R, GATED>(wr, acc, ss, cols, f, y + t * wr.outputs);
  }
}

// Batch 1: one row per warp, four loads in flight (gated: a gate/up pair,
// two each). Larger batches: rows share each activation chunk (two or four
// rows per warp).
template <int N, bool GATED>
void launch_vec(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y,
                const GemvFusion& f, cudaStream_t stream) {
  constexpr int kRows = N == 1 ? (GATED ? 2 : 1) : N < 4 ? 2 : 4;
  constexpr int kUnroll = kRows == 1 ? 4 : 2;
  const int64_t units = WarpRows<kRows, GATED>::units(rows);
  const unsigned blocks = unsigned((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
  launch(gemv_bf16_vec<N, kRows, kUnroll, GATED>, blocks, kWarpsPerBlock * 32, 0, stream, W, rows,
         cols, x, y, f);
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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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

void gemv_bf16(const uint16_t* W, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
               cudaStream_t stream, const GemvFusion& fusion) {
  if (rows <= 0 || n <= 0) return;
  check_fusion(fusion, rows, "gemv_bf16");
  const bool vec = cols % 8 == 0 && aligned16(W) && aligned16(x) &&
                   (!fusion.normalize || !fusion.norm_weight || aligned16(fusion.norm_weight));
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
    if (fusion.gate != GemvGate::None)
      launch_vec<N, true>(W, rows, cols, xt, yt, fusion, stream);
    else
      launch_vec<N, false>(W, rows, cols, xt, yt, fusion, stream);
  });
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::cuda
