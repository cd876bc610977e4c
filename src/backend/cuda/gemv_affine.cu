// The decode GEMV over packed affine 4/8-bit weights (MLX layout), with the
// CPU's method (backend/cpu/kernels_quant.h): each activation row is first
// quantized to int8 in blocks of 32 values (d = max|x| / 127, q =
// round(x · 127 / max|x|)), then
//   y = Σ_vectors s_g · d · Σ code · q  +  b_g · d · Σ q
// with the integer sums on dp4a (4 products an instruction). Dequantizing
// each weight in f32 instead (unpack, scale · code + bias, one fma a batch
// row) bound the kernel by its instructions: llama-3.2-1b q4 1,264 tok/s at
// batch 1 on the H200; this one does 1,549.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/affine_codes.h"
#include "backend/cuda/check.h"
#include "backend/cuda/gemv_fusion.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/reduce.h"
#include "backend/cuda/runtime.h"

namespace tandem::cuda {

namespace {

using namespace gemv;

using affine::Acts;

size_t act_row_bytes(int bits, int64_t cols) {
  return bits == 4 ? Acts<4>::row_bytes(int(cols)) : Acts<8>::row_bytes(int(cols));
}

// a[k] by a select over registers (indexing with a run-time k would put
// the array in local memory).
template <int K>
__device__ __forceinline__ float4 pick(const float4 (&a)[K], int k) {
  float4 r = a[0];
#pragma unroll
  for (int c = 1; c < K; ++c)
    if (c == k) r = a[c];
  return r;
}

constexpr int kQuantizeThreads = 512;
// float4s of x a thread keeps in registers between the norm's sum and the
// quantization (up to 12,288 columns; wider rows read the rest twice), and of
// the norm weight, loaded before the PDL wait (up to 4,096 columns).
constexpr int kCachedX = 6, kCachedW = 2;

// Quantizes row blockIdx.x of x ([n, cols]) into `out`: Acts<BITS> rows
// row_bytes apart, or with mma_tokens (4 bits) the MmaActs layout of that
// many tokens (blocks n .. mma_tokens - 1 write the pad rows' zeros). With `normalize`, the row is
// first rmsnorm(x) · norm_weight (null: no weight) as the CPU's rmsnorm computes it: x · inv · w,
// inv = 1 / sqrt(Σx² / cols + eps). kQuantizeThreads threads; thread i takes float4s i, i +
// kQuantizeThreads, ..., so 8 neighbours hold a block of 32 values. This kernel sits on the decode
// chain between each GEMV's producer and the GEMV (whose blocks wait in pdl_wait with their first
// weights loaded): every load it can issue early, it does (the norm weight before the PDL wait; x
// once, kept in registers). x, written by the kernel before, is read with plain loads, never __ldg
// (see gemv_affine_kernel).
//
// With `pre.add` (GemvFusion::pre_add, Gemma's sandwich norms; rows of at
// most kPreAddMaxCols, all of them in registers): the row is first
// h' = (x + rmsnorm(pre.add) · pre.weight) · pre.scale, written to
// pre.residual_out, and h' is what the norm and the quantization take.
struct PreAdd {
  const float* add = nullptr;     // [n, cols], written by an earlier kernel
  const float* weight = nullptr;  // [cols]
  float scale = 1.f;
  float* residual_out = nullptr;  // [n, cols]
};
constexpr int kPreAddMaxCols = 4 * kQuantizeThreads * kCachedX;

__device__ __forceinline__ float sum_squares(float4 a) {
  return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
}

// One block of 32 columns of a row quantized: d = max|x| / 127 and q =
// round(x · 127 / max|x|), by the 8 neighbouring lanes that hold it (lane j
// = lane % 8: columns 4j .. 4j + 3, in `a`), with Σ q over the lane's vector
// (the block at 4 bits, 8 lanes; at 8 bits a vector is 16 columns, 4
// lanes). Every lane of the warp must call it (shuffles).
struct QuantizedBlock {
  int q[4];
  float d;
  int sum;
};
template <int BITS>
__device__ __forceinline__ QuantizedBlock quantize_block(float4 a) {
  float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(a.z), fabsf(a.w)));
#pragma unroll
  for (int m = 1; m < 8; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const float id = affine::int8_inverse_scale(amax);
  QuantizedBlock b;
  b.d = affine::int8_scale(amax);
  b.q[0] = affine::int8_code(a.x, id), b.q[1] = affine::int8_code(a.y, id);
  b.q[2] = affine::int8_code(a.z, id), b.q[3] = affine::int8_code(a.w, id);
  b.sum = b.q[0] + b.q[1] + b.q[2] + b.q[3];
#pragma unroll
  for (int m = 1; m < Acts<BITS>::kVecCols / 4; m <<= 1)
    b.sum += __shfl_xor_sync(0xffffffffu, b.sum, m);
  return b;
}

__device__ __forceinline__ uint32_t q_byte(int q) {
  return uint32_t(uint8_t(int8_t(q)));
}

// At 4 bits, a lane's 4 columns go to its word's bytes as evens then odds:
// columns +0 and +2 to base[0..1], +1 and +3 to base[4..5] (Acts<4> and
// MmaActs alike).
__device__ __forceinline__ void store_even_odd(uint8_t* base, const int (&q)[4]) {
  *reinterpret_cast<uint16_t*>(base) = uint16_t(q_byte(q[0]) | q_byte(q[2]) << 8);
  *reinterpret_cast<uint16_t*>(base + 4) = uint16_t(q_byte(q[1]) | q_byte(q[3]) << 8);
}

// Lane j's share (columns 4j .. 4j + 3) of block `blk` of an Acts<BITS> row
// of `vecs` vectors: its q bytes and, from the vector's first lane, (d, d ·
// Σ q). 4 bits: the columns are word j / 2's in-word columns 4 (j % 2) +
// 0..3 — the evens (+0, +2) to its even bytes 2 (j % 2) and + 1, the odds
// (+1, +3) likewise.
template <int BITS>
__device__ __forceinline__ void store_block(const QuantizedBlock& b, int j, int blk, uint8_t* row,
                                            int vecs, float2* meta) {
  if constexpr (BITS == 4) {
    const int word = j / 2;
    store_even_odd(row + size_t(word / 2) * 16 * size_t(vecs) + size_t(blk) * 16 +
                       size_t(word % 2) * 8 + 2 * (j % 2),
                   b.q);
    if (j == 0) meta[blk] = make_float2(b.d, float(b.sum) * b.d);
  } else {
    const int vec = 2 * blk + j / 4;
    *reinterpret_cast<uint32_t*>(row + size_t(vec) * 16 + 4 * (j % 4)) =
        q_byte(b.q[0]) | q_byte(b.q[1]) << 8 | q_byte(b.q[2]) << 16 | q_byte(b.q[3]) << 24;
    if (j % 4 == 0) meta[vec] = make_float2(b.d, float(b.sum) * b.d);
  }
}

template <int BITS>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_acts_kernel(const float* x, int n, int cols, bool normalize,
                         const float* __restrict__ norm_weight, float eps,
                         uint8_t* __restrict__ out, size_t row_bytes, int mma_tokens, PreAdd pre) {
  using A = Acts<BITS>;
  constexpr int NT = kQuantizeThreads;
  __shared__ float partial[NT / 32];
  pdl_launch_dependents();
  const int tid = int(threadIdx.x), quads = cols / 4;
  const float4* gw =
      normalize && norm_weight ? reinterpret_cast<const float4*>(norm_weight) : nullptr;
  const float4 one = make_float4(1.f, 1.f, 1.f, 1.f), zero = make_float4(0.f, 0.f, 0.f, 0.f);
  auto weight = [&](int f) { return gw && f < quads ? __ldg(gw + f) : one; };
  float4 g[kCachedW];
#pragma unroll
  for (int k = 0; k < kCachedW; ++k) g[k] = weight(tid + NT * k);
  const float4* pw = reinterpret_cast<const float4*>(pre.weight);
  float4 pws[kCachedX];
  if (pre.add) {
#pragma unroll
    for (int k = 0; k < kCachedX; ++k)
      pws[k] = tid + NT * k < quads ? __ldg(pw + tid + NT * k) : one;
  }
  pdl_wait();
  const int token = int(blockIdx.x);
  const bool real = token < n;  // else a pad row of zeros
  const float4* xr = reinterpret_cast<const float4*>(x + size_t(token) * size_t(cols));
  uint8_t* row = out + size_t(token) * row_bytes;
  auto value = [&](int f) { return real && f < quads ? xr[f] : zero; };
  float4 xs[kCachedX];
#pragma unroll
  for (int k = 0; k < kCachedX; ++k) xs[k] = value(tid + NT * k);
  if (pre.add) {  // xs becomes h' (the host keeps cols within the cache)
    const float4* ar = reinterpret_cast<const float4*>(pre.add + size_t(token) * size_t(cols));
    float4 as[kCachedX];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kCachedX; ++k) {
      as[k] = real && tid + NT * k < quads ? ar[tid + NT * k] : zero;
      ss += sum_squares(as[k]);
    }
    const float s1 = 1.0f / sqrtf(block_sum<NT>(ss, partial) / float(cols) + eps), k2 = pre.scale;
    float4* hr = reinterpret_cast<float4*>(pre.residual_out + size_t(token) * size_t(cols));
#pragma unroll
    for (int k = 0; k < kCachedX; ++k) {
      const float4 a = xs[k], u = as[k], w = pws[k];
      xs[k] = make_float4((a.x + s1 * u.x * w.x) * k2, (a.y + s1 * u.y * w.y) * k2,
                          (a.z + s1 * u.z * w.z) * k2, (a.w + s1 * u.w * w.w) * k2);
      if (real && tid + NT * k < quads) hr[tid + NT * k] = xs[k];
    }
  }
  float inv = 1.f;
  if (normalize) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kCachedX; ++k) ss += sum_squares(xs[k]);
    for (int f = tid + NT * kCachedX; f < quads; f += NT) ss += sum_squares(value(f));
    inv = 1.0f / sqrtf(block_sum<NT>(ss, partial) / float(cols) + eps);
  }
  const int warp = tid / 32, vecs = A::vecs(cols), j = tid % 8;
  float2* meta = reinterpret_cast<float2*>(row + A::meta_at(cols));
  float2* mma_meta = reinterpret_cast<float2*>(out + affine::MmaActs::meta_at(cols, mma_tokens));
  // Warp-uniform trip count (the shuffles need every lane): while the
  // warp's first float4 is in the row; groups past it quantize zeros.
  for (int k = 0; 32 * warp + NT * k < quads; ++k) {
    const int f = tid + NT * k, blk = f / 8;
    const bool valid = f < quads;
    float4 a = k < kCachedX ? pick(xs, k) : value(f);
    if (normalize) {
      const float4 w = k < kCachedW ? pick(g, k) : weight(f);
      a = make_float4(a.x * inv * w.x, a.y * inv * w.y, a.z * inv * w.z, a.w * inv * w.w);
    }
    const QuantizedBlock b = quantize_block<BITS>(a);
    if (!valid) continue;
    if (BITS == 4 && mma_tokens) {  // MmaActs: word j / 2's 8 bytes at 8 (j / 2) of the slot
      const size_t slot = size_t(blk) * size_t(mma_tokens) + size_t(token);
      store_even_odd(out + slot * 32 + size_t(j / 2) * 8 + 2 * (j % 2), b.q);
      if (j == 0) mma_meta[slot] = make_float2(b.d, float(b.sum) * b.d);
    } else {
      store_block<BITS>(b, j, blk, row, vecs, meta);
    }
  }
}

// EXPERIMENT (session 44; TANDEM_CUDA_AFFINE_SELF_NORM=1, off by default):
// at batch 1, a 4-bit GEMV whose input is normed (GemvFusion::normalize,
// with or without pre_add) builds the quantized row in each block's own
// shared memory instead of reading it from quantize_acts_kernel's launch
// before it: one dependent launch fewer on q/k/v and gate/up, at the cost of
// every block repeating the norm and the quantization of the row. Session
// 22 measured that trade as a loss (-8 to -16%), but for every packed GEMV,
// including the down projections' 6-9k-column rows; here only rows of up
// to kSelfMaxCols (the hidden size), whose values stay in registers.
// Measured (session 44, H100, batch 1): llama-3.2-1b +2.4-3.3%, qwen3-1.7b
// flat, ministral-3-3b -5%, gemma-3-1b -7%, gemma-4-e2b -15%. Its blocks now
// ask for shared memory, which by bench_cuda_cluster_pdl costs them the PDL
// early start (and the weights loaded before the wait) behind kernels
// without any: to measure again under TANDEM_CUDA_CARVEOUT=0.
struct SelfNorm {
  const float* x = nullptr;  // [1, cols], the raw residual stream
  const float* norm_weight = nullptr;
  float eps = 0.f;
  PreAdd pre;
};
constexpr int kSelfThreads = kWarpsPerBlock * 32;
constexpr int kSelfCachedX = 3;
constexpr int kSelfMaxCols = 4 * kSelfThreads * kSelfCachedX;
// Acts<4>::row_bytes(kSelfMaxCols): 2 planes of 16 bytes and a float2 per
// 32 columns.
constexpr int kSelfActBytes = kSelfMaxCols + kSelfMaxCols / 32 * 8;

// Calls run(std::integral_constant<int, SELF>{}) with the kernels' SELF
// argument for `self`: 0 when its x is unset, 2 with pre_add, else 1.
template <class Run>
void with_self(const SelfNorm& self, Run&& run) {
  if (!self.x) return run(std::integral_constant<int, 0>{});
  if (self.pre.add) return run(std::integral_constant<int, 2>{});
  run(std::integral_constant<int, 1>{});
}

// The block's prologue: row 0 of the input, built as quantize_acts_kernel
// builds it (h' = (x + rmsnorm(pre.add) · pre.weight) · pre.scale with
// pre.add, then rmsnorm(h') · norm_weight, quantized by 32-value blocks) into
// `row` (Acts<4>, shared memory). With pre.add the block also writes its
// share of h' to pre.residual_out (float4 i: block i mod grid). The sums
// go through one block reduction (Σ a², Σ x², Σ x·u, Σ u², u = a ·
// pre.weight; Σ h'² expanded, as gemv_bf16_pre_add does). Every thread of
// the block calls it, after the PDL wait; it ends with a block barrier.
template <bool PRE>
__device__ __forceinline__ void self_quantize_row(const SelfNorm& in, int cols, uint8_t* row,
                                                  float (*partial)[4]) {
  constexpr int NT = kSelfThreads, K = kSelfCachedX;
  using A = Acts<4>;
  const int tid = int(threadIdx.x), quads = cols / 4, warp = tid / 32, lane = tid % 32;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f), one = make_float4(1.f, 1.f, 1.f, 1.f);
  const float4* xr = reinterpret_cast<const float4*>(in.x);
  const float4* gw = reinterpret_cast<const float4*>(in.norm_weight);
  float4 xs[K], us[K], gs[K];
  float sums[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int f = tid + NT * k;
    const bool ok = f < quads;
    xs[k] = ok ? xr[f] : zero;
    gs[k] = ok && gw ? __ldg(gw + f) : one;
    us[k] = zero;
    if (PRE && ok) {
      const float4 a = reinterpret_cast<const float4*>(in.pre.add)[f];
      const float4 w = __ldg(reinterpret_cast<const float4*>(in.pre.weight) + f);
      us[k] = make_float4(a.x * w.x, a.y * w.y, a.z * w.z, a.w * w.w);
      sums[0] += sum_squares(a);
    }
    const float4 x = xs[k], u = us[k];
    sums[1] += sum_squares(x);
    sums[2] += x.x * u.x + x.y * u.y + x.z * u.z + x.w * u.w;
    sums[3] += sum_squares(u);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sums[i] = warp_sum(sums[i]);
    if (lane == 0) partial[warp][i] = sums[i];
  }
  __syncthreads();
  float total[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) total[i] += partial[w][i];
  float s1 = 0.f, k2 = 1.f, hh = total[1];
  if (PRE) {
    s1 = 1.0f / sqrtf(total[0] / float(cols) + in.eps);
    k2 = in.pre.scale;
    hh = k2 * k2 * (total[1] + 2.f * s1 * total[2] + s1 * s1 * total[3]);
  }
  const float inv = 1.0f / sqrtf(hh / float(cols) + in.eps);
  const int vecs = A::vecs(cols), j = tid % 8;
  float2* meta = reinterpret_cast<float2*>(row + A::meta_at(cols));
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (32 * warp + NT * k >= quads) break;  // warp-uniform: the shuffles need every lane
    const int f = tid + NT * k;
    float4 h = xs[k];
    if (PRE) {
      const float4 u = us[k];
      h = make_float4((h.x + s1 * u.x) * k2, (h.y + s1 * u.y) * k2, (h.z + s1 * u.z) * k2,
                      (h.w + s1 * u.w) * k2);
      if (f < quads && f % int(gridDim.x) == int(blockIdx.x))
        reinterpret_cast<float4*>(in.pre.residual_out)[f] = h;
    }
    const float4 g = gs[k];
    const QuantizedBlock b = quantize_block<4>(
        make_float4(h.x * inv * g.x, h.y * inv * g.y, h.z * inv * g.z, h.w * inv * g.w));
    if (f < quads) store_block<4>(b, j, f / 8, row, vecs, meta);
  }
  __syncthreads();
}

// c + Σ of the 4 byte products: unsigned codes (8-bit codes reach 255)
// times signed activations.
__device__ __forceinline__ int dot4(uint32_t codes, uint32_t acts, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(codes), "r"(acts), "r"(c));
  return d;
}

// GemvFusion::quantized_out's epilogue, for a gated kernel with SPLIT 1 and
// ROWS 8 (a warp's 4 gate/up pairs; a block's 8 warps, 32 consecutive
// outputs: vector blockIdx.x of the next GEMV's Acts<4> rows). The outputs
// act(gate) · up as finish computes them, gathered in shared memory, then
// quantized by warp 0, lanes 8t .. 8t + 7 taking batch row t, into the rows
// of `qout`, qrow_bytes apart. Every warp of the block must call it.
template <int N, int ROWS>
__device__ __forceinline__ void finish_quantized(const WarpRows<ROWS, true>& wr,
                                                 float (&acc)[ROWS][N], const GemvFusion& f,
                                                 uint8_t* qout, size_t qrow_bytes) {
  static_assert(ROWS == 8 && N <= 4, "a block's 32 outputs of up to 4 batch rows");
  constexpr int kOut = ROWS / 2;
  __shared__ float4 outs[N][8];
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < N; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kOut; ++r)
#pragma unroll
      for (int t = 0; t < N; ++t)
        reinterpret_cast<float*>(outs[t])[warp * kOut + r] = gated_output(wr, acc, r, t, f);
  }
  __syncthreads();
  if (warp != 0) return;
  const int t = lane / 8, j = lane % 8;
  const QuantizedBlock b = quantize_block<4>(t < N ? outs[t][j] : make_float4(0.f, 0.f, 0.f, 0.f));
  if (t >= N) return;
  const int cols = int(wr.outputs);
  uint8_t* row = qout + size_t(t) * qrow_bytes;
  store_block<4>(b, j, int(blockIdx.x), row, Acts<4>::vecs(cols),
                 reinterpret_cast<float2*>(row + Acts<4>::meta_at(cols)));
}

// y[t, r] = Σ_vectors (s · d · Σ code · q + b · d · Σ q) over the quantized
// activations (Acts), with the epilogue fusions of GemvFusion (the input
// norm was applied by quantize_acts_kernel, or the activations came
// quantized from a gated GEMV's finish_quantized). A warp streams ROWS rows
// (WarpRows: one, or a gate/up pair when gated); lane i loads each row's
// 16-byte vectors i, i + 32, ..., UNROLL per row in flight, the first of them
// issued before the PDL wait (weights are never written), and the
// activation planes of the same vectors (consecutive lanes, consecutive 16
// bytes). Index math is 32-bit with the group size as a shift. SPLIT warps
// share a unit's vectors (ColumnShare) when its rows alone would leave SMs
// short of warps.
// The activations are read with plain (coherent) loads, cached in L1 — not
// through the non-coherent path of __ldg (ld.global.nc), whose contract is
// that the data does not change while the grid lives: under PDL this grid
// starts before the quantize kernel ahead of it has written the scratch, and
// beside the previous GEMV's blocks, which read the previous activations at
// the same addresses. With __ldg the 4-bit fixtures came out 5 × std off at
// steps of 2 on the H200, every fixture, every time; with plain loads they
// match the CPU to 1e-6 (three repeats) at __ldg's speed (llama q4 batch 1:
// 1,549 tok/s; ld.global.cg, which skips L1: 1,116; staging each block's
// activations in shared memory with ld.global.cg: 1,481). Quantizing the
// row in each block's own prologue instead of in quantize_acts_kernel (one
// dependent launch fewer a projection) lost 10-16% at batch 1 on the H100
// (session 22: llama q4 1,337 -> 1,176 tok/s): every block repeats it.
// QOUT: the outputs go to qout, quantized (finish_quantized), not to y (the
// kernel gemv_affine_qout_kernel, below).
// SELF (N 1, BITS 4): the block builds the quantized row itself from
// `self` (self_quantize_row) after the PDL wait; acts is not read. 0: no;
// 1: the norm; 2: pre_add and the norm.
template <int N, int BITS, int ROWS, int UNROLL, bool GATED, int SPLIT, bool QOUT, int SELF = 0>
__device__ __forceinline__ void gemv_affine_body(
    const uint4* __restrict__ W, const float* __restrict__ scales, const float* __restrict__ biases,
    int group_shift, int rows, int cols, const uint8_t* acts, size_t act_bytes, float* y,
    GemvFusion f, uint8_t* qout, size_t qrow_bytes, const SelfNorm& self = SelfNorm{}) {
  static_assert(!SELF || (N == 1 && BITS == 4), "a block quantizes one 4-bit row itself");
  using A = Acts<BITS>;
  constexpr int VC = A::kVecCols;
  const WarpRows<ROWS, GATED> wr(ColumnShare<SPLIT>::unit(), rows);
  const int lane = threadIdx.x % 32;
  pdl_launch_dependents();
  // Split warps meet at gather_split's barrier, and SELF's prologue has
  // block barriers: their warps stay.
  if (!SELF && SPLIT == 1 && !wr.any()) return;
  const int vecs = A::vecs(cols), groups = cols >> group_shift;
  const ColumnShare<SPLIT> share(vecs);
  const int first = int(share.first), count = int(share.count);  // this warp's vectors
  const uint4* w[ROWS];
  const float *sc[ROWS], *bi[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = int(wr.row(r));
    w[r] = W + size_t(row) * size_t(vecs) + first;
    sc[r] = scales + size_t(row) * size_t(groups);
    bi[r] = biases + size_t(row) * size_t(groups);
  }
  // The codes of vectors i + 32u and their groups' scales and biases (which
  // would otherwise be a second round trip after the codes arrive).
  uint4 v[ROWS][UNROLL];
  float sv[ROWS][UNROLL], bv[ROWS][UNROLL];
  const auto load = [&](int i) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (i + 32 * u < count) {
          const int g = ((first + i + 32 * u) * VC) >> group_shift;
          v[r][u] = __ldg(w[r] + i + 32 * u);
          sv[r][u] = __ldg(sc[r] + g);
          bv[r][u] = __ldg(bi[r] + g);
        }
  };
  load(lane);
  pdl_wait();
  if constexpr (SELF) {
    __shared__ __align__(16) uint8_t own_row[kSelfActBytes];
    __shared__ float own_partial[kWarpsPerBlock][4];
    self_quantize_row<SELF == 2>(self, cols, own_row, own_partial);
    acts = own_row;
    act_bytes = A::row_bytes(cols);
    if (SPLIT == 1 && !wr.any()) return;
  }
  const uint4* planes = reinterpret_cast<const uint4*>(acts);  // row t, plane p: + (t·rb + p·vecs)
  const float2* meta = reinterpret_cast<const float2*>(acts + A::meta_at(cols));
  const int row_vec4s = int(act_bytes / 16), row_float2s = int(act_bytes / 8);
  float acc[ROWS][N], ss[N];
  zero_sums(acc, ss);
  for (int i = lane; i < count; i += 32 * UNROLL) {
    if (i != lane) load(i);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = i + 32 * u;
      if (c >= count) break;
      const int vec = first + c;
      // The codes as dp4a operands: at 4 bits each word's even and odd
      // nibbles (the order quantize_acts_kernel laid the activations in).
      uint32_t ops[ROWS][4 * A::kPlanes];
      float s[ROWS], b[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        s[r] = sv[r][u], b[r] = bv[r][u];
        const uint32_t words[4] = {v[r][u].x, v[r][u].y, v[r][u].z, v[r][u].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (BITS == 4) {
            ops[r][2 * k] = words[k] & 0x0F0F0F0Fu;
            ops[r][2 * k + 1] = (words[k] >> 4) & 0x0F0F0F0Fu;
          } else {
            ops[r][k] = words[k];
          }
        }
      }
#pragma unroll
      for (int t = 0; t < N; ++t) {
        uint32_t q[4 * A::kPlanes];
#pragma unroll
        for (int p = 0; p < A::kPlanes; ++p) {
          const uint4 a = planes[t * row_vec4s + p * vecs + vec];
          q[4 * p] = a.x, q[4 * p + 1] = a.y, q[4 * p + 2] = a.z, q[4 * p + 3] = a.w;
        }
        const float2 m = meta[t * row_float2s + vec];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          int isum = 0;
#pragma unroll
          for (int k = 0; k < 4 * A::kPlanes; ++k) isum = dot4(ops[r][k], q[k], isum);
          acc[r][t] += float(isum) * (s[r] * m.x) + b[r] * m.y;
        }
      }
    }
  }
  if (!gather_split<N, ROWS, SPLIT>(acc, ss)) return;
  if constexpr (QOUT)
    finish_quantized<N, ROWS>(wr, acc, f, qout, qrow_bytes);
  else
    finish<N, ROWS, GATED>(wr, acc, ss, cols, f, y);
}

// SELF kernels are bound to 3 blocks an SM (85 registers; unbound, the
// prologue's row took them to 100-108, 2 blocks).
template <int N, int BITS, int ROWS, int UNROLL, bool GATED, int SPLIT, int SELF>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, SELF ? 3 : 1)
    gemv_affine_kernel(const uint4* __restrict__ W, const float* __restrict__ scales,
                       const float* __restrict__ biases, int group_shift, int rows, int cols,
                       const uint8_t* acts, size_t act_bytes, float* y, GemvFusion f,
                       SelfNorm self) {
  gemv_affine_body<N, BITS, ROWS, UNROLL, GATED, SPLIT, false, SELF>(
      W, scales, biases, group_shift, rows, cols, acts, act_bytes, y, f, nullptr, 0, self);
}

// GemvFusion::quantized_out's kernel: MIN_BLOCKS blocks an SM — 2 (at
// most 128 registers) or 3 (85) — so the 192-288 blocks of the models'
// gate/up matrices run in about one wave (at batch 2 and 2 blocks it spills
// 152 bytes and still gains 1-8%).
template <int N, int MIN_BLOCKS, int SELF>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, MIN_BLOCKS)
    gemv_affine_qout_kernel(const uint4* __restrict__ W, const float* __restrict__ scales,
                            const float* __restrict__ biases, int group_shift, int rows, int cols,
                            const uint8_t* acts, size_t act_bytes, GemvFusion f, uint8_t* qout,
                            size_t qrow_bytes, SelfNorm self) {
  gemv_affine_body<N, 4, 8, 1, true, 1, true, SELF>(W, scales, biases, group_shift, rows, cols,
                                                    acts, act_bytes, nullptr, f, qout, qrow_bytes,
                                                    self);
}

// A 2,048-column row is 64 vectors at 4 bits: 2 per lane, all in flight
// with the other row of a gate/up pair. Batches of up to kMaxSplitBatch rows
// split a unit's vectors over warps when it has few rows (gemv_affine_split).
// self.x set (N 1, 4 bits): the SELF kernels, which quantize the input
// themselves.
template <int N, int BITS, bool GATED>
void launch_gemv(const AffineMatrix& w, const uint8_t* acts, size_t act_bytes, float* y,
                 const GemvFusion& f, const SelfNorm& self, cudaStream_t stream) {
  constexpr int kRows = GATED ? 2 : 1;
  constexpr int kUnroll = (N <= 2 ? 4 : 2) / kRows;
  const int64_t units = WarpRows<kRows, GATED>::units(w.rows);
  with_split(gemv_affine_split(w, N, GATED), [&](auto s) {
    constexpr int S = decltype(s)::value;
    if constexpr (S == 1 || N <= kMaxSplitBatch) {
      constexpr int kUnits = ColumnShare<S>::kUnitsPerBlock;
      const unsigned blocks = unsigned((units + kUnits - 1) / kUnits);
      const auto run = [&](auto kernel) {
        launch(kernel, blocks, kWarpsPerBlock * 32, 0, stream,
               reinterpret_cast<const uint4*>(w.data), w.scales, w.biases,
               affine::log2_exact(w.group), int(w.rows), int(w.cols), acts, act_bytes, y, f, self);
      };
      with_self(self, [&](auto q) {
        constexpr int Q = decltype(q)::value;
        if constexpr (Q == 0 || (N == 1 && BITS == 4))
          run(gemv_affine_kernel<N, BITS, kRows, kUnroll, GATED, S, Q>);
      });
    }
  });
}

// The gated GEMV of GemvFusion::quantized_out: 4 gate/up pairs a warp, a
// block's 32 outputs quantized in its epilogue; one 16-byte vector of each
// row in flight a lane (two spilled at 128 registers and lost 4-30% on the
// H100, thirty-first session). Two blocks an SM, except at batch 1 where
// the blocks outnumber two an SM's (ministral-3-3b: 288 on the H100's 132
// SMs): three (80 registers, no spills), so they run in one wave. Measured
// on the H100 with three blocks everywhere (thirty-first session):
// ministral 698 -> 732 tok/s, llama-3.2-1b (256 blocks) +0.4%, gemma-3-1b
// (216) -2.6%. TANDEM_CUDA_QOUT_BLOCKS=2 or 3 forces one (batch 1).
template <int N>
void launch_gemv_quantized_out(const AffineMatrix& w, const uint8_t* acts, size_t act_bytes,
                               const GemvFusion& f, uint8_t* qout, size_t qrow_bytes,
                               const SelfNorm& self, cudaStream_t stream) {
  const int64_t blocks = w.rows / 2 / 32;
  static const int64_t forced = env_count("TANDEM_CUDA_QOUT_BLOCKS", 0);
  const bool three =
      N == 1 &&
      (forced ? forced == 3 : blocks > 2 * int64_t(current_launch_limits().multiprocessors));
  const auto run = [&](auto kernel) {
    launch(kernel, unsigned(blocks), kWarpsPerBlock * 32, 0, stream,
           reinterpret_cast<const uint4*>(w.data), w.scales, w.biases, affine::log2_exact(w.group),
           int(w.rows), int(w.cols), acts, act_bytes, f, qout, qrow_bytes, self);
  };
  with_self(self, [&](auto q) {
    constexpr int Q = decltype(q)::value;
    if constexpr (N == 1) {
      if (three) return run(gemv_affine_qout_kernel<N, 3, Q>);
    }
    if constexpr (Q == 0 || N == 1) run(gemv_affine_qout_kernel<N, 2, Q>);
  });
}

template <int BITS>
void gemv_bits(const AffineMatrix& w, const float* x, int64_t n, float* y, const GemvFusion& f,
               uint8_t* acts, cudaStream_t stream) {
  const size_t rb = Acts<BITS>::row_bytes(int(w.cols));
  const bool gated = f.gate != GemvGate::None;
  GemvFusion plain = f;  // the norm and pre_add go into the quantized activations
  plain.normalize = false;
  plain.pre_add = plain.pre_add_weight = nullptr;
  plain.residual_out = nullptr;
  plain.pre_add_scale = 1.f;
  plain.quantized_out = nullptr;
  plain.quantized_in = nullptr;
  const PreAdd pre{f.pre_add, f.pre_add_weight, f.pre_add_scale, f.residual_out};
  // The experiment above self_quantize_row: normed rows at batch 1 quantized
  // by the GEMV's own blocks.
  static const bool self_norm = env_is("TANDEM_CUDA_AFFINE_SELF_NORM", "1");
  SelfNorm self;
  if (BITS == 4 && self_norm && n == 1 && f.normalize && !f.quantized_in &&
      w.cols <= kSelfMaxCols && w.cols % 32 == 0)
    self = SelfNorm{x, f.norm_weight, f.norm_eps, pre};
  if (f.quantized_in)
    acts = const_cast<uint8_t*>(f.quantized_in);  // only read
  else if (!self.x)
    launch(quantize_acts_kernel<BITS>, unsigned(n), kQuantizeThreads, 0, stream, x, int(n),
           int(w.cols), f.normalize, f.normalize ? f.norm_weight : nullptr, f.norm_eps, acts, rb, 0,
           pre);
  const int64_t outputs = gated ? w.rows / 2 : w.rows;
  const size_t qrb = Acts<4>::row_bytes(int(outputs));
  for_batch_runs(n, [&](auto run, int64_t t0) {
    constexpr int N = decltype(run)::value;
    const GemvFusion ft = from_row(plain, t0);
    if constexpr (N <= kQuantizedOutMaxRows && BITS == 4) {
      if (f.quantized_out) {
        launch_gemv_quantized_out<N>(w, acts + t0 * rb, rb, ft, f.quantized_out + t0 * qrb, qrb,
                                     self, stream);
        return;
      }
    }
    if (gated)
      launch_gemv<N, BITS, true>(w, acts + t0 * rb, rb, y + t0 * outputs, ft, self, stream);
    else
      launch_gemv<N, BITS, false>(w, acts + t0 * rb, rb, y + t0 * outputs, ft, self, stream);
  });
}

// The quantized rows' scratch of a call, `need` bytes: `scratch` when given
// (checked: enough bytes, 16-byte aligned), else `own`, allocated for this
// call (not inside a graph capture). `what` names the caller in errors.
uint8_t* act_scratch(size_t need, int64_t n, int64_t cols, void* scratch, size_t scratch_bytes,
                     DeviceBuffer& own, const char* what) {
  if (!scratch) {
    own = DeviceBuffer(need);
    scratch = own.get();
    scratch_bytes = need;
  }
  if (scratch_bytes < need || reinterpret_cast<uintptr_t>(scratch) % 16 != 0)
    fail("%s: %zu bytes of scratch for %lld x %lld activations (needs %zu, 16-aligned)", what,
         scratch_bytes, (long long)n, (long long)cols, need);
  return static_cast<uint8_t*>(scratch);
}

// The token rows of gemm_affine_int8's activations for n tokens: rounded up
// to its kernel's token tiles.
int mma_tokens(int64_t n) {
  return affine::MmaActs::tokens(int(std::min<int64_t>(n, kAffineMmaMaxTokens)));
}

void check_shape(const AffineMatrix& w, const float* x, const char* what) {
  affine::check(w, what);
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0)
    fail("%s: activations are not 16-byte aligned", what);
  if (w.rows > INT32_MAX || w.cols > INT32_MAX)
    fail("%s: a %lld x %lld matrix is too large for the kernel", what, (long long)w.rows,
         (long long)w.cols);
}

}  // namespace

size_t gemv_affine_scratch_bytes(int bits, int64_t n, int64_t cols) {
  const size_t rows = size_t(n) * act_row_bytes(bits, cols);
  if (bits != 4) return rows;
  return std::max(rows, affine::MmaActs::bytes(int(cols), mma_tokens(n)));  // gemm_affine_int8's
}

size_t gemv_affine_quantized_row_bytes(int64_t cols) {
  return Acts<4>::row_bytes(int(cols));
}

bool gemv_affine_pre_add_fits(int64_t cols) {
  return cols % 4 == 0 && cols <= kPreAddMaxCols;
}

bool gemv_affine_quantized_out_fits(const AffineMatrix& w, int64_t n) {
  return w.bits == 4 && n >= 1 && n <= kQuantizedOutMaxRows && w.rows % 64 == 0;
}

int gemv_affine_split(const AffineMatrix& w, int64_t n, bool gated) {
  if (n > kMaxSplitBatch) return 1;
  // launch_gemv's warp units: one row, or a gate/up pair, a warp.
  const int64_t units =
      gated ? WarpRows<2, true>::units(w.rows) : WarpRows<1, false>::units(w.rows);
  // At least 16 vectors (64 words) a warp.
  return column_split(units, w.cols / (128 / w.bits), 16);
}

void gemv_affine(const AffineMatrix& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                 const GemvFusion& fusion, void* scratch, size_t scratch_bytes) {
  if (w.rows <= 0 || n <= 0) return;
  check_shape(w, x, "gemv_affine");
  if (fusion.pre_add && !gemv_affine_pre_add_fits(w.cols))
    fail(
        "gemv_affine: the sandwich-norm fusion (pre_add) takes rows of at most %d columns, a "
        "multiple of 4 (got %lld)",
        kPreAddMaxCols, (long long)w.cols);
  gemv::check_fusion(fusion, w.rows, "gemv_affine", /*pre_add_ok=*/true, /*quantized_ok=*/true);
  if (fusion.quantized_out &&
      (fusion.gate == GemvGate::None || !gemv_affine_quantized_out_fits(w, n) ||
       !aligned16(fusion.quantized_out)))
    fail(
        "gemv_affine: quantized_out takes a gated GEMV over 4-bit weights, 1-%lld batch rows and "
        "a multiple of 32 outputs into 16-byte aligned scratch (got %d bits, %lld rows, batch "
        "%lld)",
        (long long)kQuantizedOutMaxRows, w.bits, (long long)w.rows, (long long)n);
  if (fusion.quantized_in &&
      (w.bits != 4 || fusion.normalize || fusion.pre_add || !aligned16(fusion.quantized_in)))
    fail(
        "gemv_affine: quantized_in takes 4-bit weights, no input norm or pre_add, and 16-byte "
        "aligned activations (got %d bits)",
        w.bits);
  for (const void* p :
       {static_cast<const void*>(fusion.norm_weight), static_cast<const void*>(fusion.pre_add),
        static_cast<const void*>(fusion.pre_add_weight),
        static_cast<const void*>(fusion.residual_out)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      fail(
          "gemv_affine: the norm weight, pre_add, its weight and residual_out must be 16-byte "
          "aligned");
  DeviceBuffer own;
  uint8_t* acts = act_scratch(size_t(n) * act_row_bytes(w.bits, w.cols), n, w.cols, scratch,
                              scratch_bytes, own, "gemv_affine");
  if (w.bits == 4)
    gemv_bits<4>(w, x, n, y, fusion, acts, stream);
  else
    gemv_bits<8>(w, x, n, y, fusion, acts, stream);
}

void gemm_affine_int8(const AffineMatrix& w, const float* x, int64_t n, float* y,
                      cudaStream_t stream, void* scratch, size_t scratch_bytes) {
  if (w.rows <= 0 || n <= 0) return;
  check_shape(w, x, "gemm_affine_int8");
  if (!affine_mma_takes(w, n))
    fail(
        "gemm_affine_int8: %d-bit weights over %lld tokens (4 bits only; up to %d tokens, the "
        "decode kernel's shared memory must fit the device)",
        w.bits, (long long)n, kAffineMmaMaxTokens);
  DeviceBuffer own;
  const int tokens = mma_tokens(n);
  uint8_t* acts = act_scratch(affine::MmaActs::bytes(int(w.cols), tokens), n, w.cols, scratch,
                              scratch_bytes, own, "gemm_affine_int8");
  launch(quantize_acts_kernel<4>, unsigned(tokens), kQuantizeThreads, 0, stream, x, int(n),
         int(w.cols), false, static_cast<const float*>(nullptr), 0.f, acts, size_t(0), tokens,
         PreAdd{});
  launch_affine_mma(w, acts, n, y, stream);
}

}  // namespace tandem::cuda
