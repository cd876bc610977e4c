// Prefill attention for the CUDA defaults — bf16 KV rows and bf16 inputs
// (PagedAttention::kv_bf16 and bf16_inputs) — at head dims 64, 128, 256 and
// 512: the contract of attention_prefill (backend/cuda/kernels.h) with one
// tensor-core product per product, built for throughput where
// attention_prefill.cu's kernel is built for its hi/lo numerics:
//
// - key tiles of 64 rows at head dims 64 and 128 (32 there): half the
//   barriers, copies issued and softmax rescales per key;
// - at those dims each warp's q·scale fragments stay in registers for the
//   whole pass, loaded straight from q (at 256 and 512, in shared memory,
//   staged by the warp that reads them, with no block barrier);
// - at head dim 512 two warps share each 16 query rows: each takes half the
//   dims of the scores' dot products (the halves summed through shared
//   memory) and half the output dims, so no score is computed twice and an
//   SM runs 8 warps (split 2, 2.7x split 1 on the H100) — with split 1, 256
//   output dims a block, the scores computed twice by 4-warp blocks;
// - scores in log2 units (log2(e) folded into q·scale, or into the
//   soft-cap's factor), so the softmax takes one ex2 per weight;
// - the mask is evaluated only on tiles that straddle a row's key range;
// - the latest query tiles (the most keys under a causal mask) start first
//   and a tile's query heads are neighbours in the grid (their kv head's
//   rows stay in L2).
//
// On the H200 it is 2.0-2.7x the general kernel (bf16 inputs) at 4,096
// tokens (bench_cuda_attention) and lifts prefill of 4,096 tokens 18-36% by
// model (bench/results/cuda-opt-in-2026-12-05.md).
#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

namespace {

constexpr int kSlabs = 4;           // slabs of 16 query rows a block
constexpr int kRows = 16 * kSlabs;  // query rows per block: attention_prefill_tiles cuts 64
static_assert(kRows == 64, "four slabs of 16 rows make a 64-token tile");
constexpr int kPad = 8;  // bf16 row padding: ldmatrix rows hit distinct banks
constexpr float kLog2e = 1.4426950408889634f;

// A kernel: D dims (64, 128, 256 or 512); SPLIT warps a slab of 16 query
// rows (1, or 2 at 256 and 512), warp w taking slab w % 4 and part w / 4:
// DW of the scores' dims and OW of the block's DV output dims; D / DV blocks
// per (tile, head), each recomputing the scores (only split 1 at 512: the
// 128 accumulators of 256 output dims are as many as a warp can hold); KEYS
// keys a tile; whether q·scale stays in registers (QREG) or in shared memory
// (at 256 and 512 the accumulators leave no room for it). BLOCKS: the blocks
// an SM should hold (the register cap the compiler gets).
template <int D, int SPLIT>
struct Shape {
  static_assert(D == 64 || D == 128 || D == 256 || D == 512, "head dims 64, 128, 256, 512");
  static_assert(SPLIT == 1 || (SPLIT == 2 && D >= 256), "split 2 at head dims 256 and 512");
  static constexpr int WARPS = kSlabs * SPLIT;
  static constexpr bool QREG = D <= 128;
  static constexpr int DV = D == 512 && SPLIT == 1 ? 256 : D, KEYS = QREG ? 64 : 32;
  static constexpr int DW = D / SPLIT, OW = DV / SPLIT;
  static constexpr int BLOCKS = D == 64 ? 4 : D == 512 || SPLIT == 2 ? 1 : 2;
};

// Shared memory: q·scale ([kRows][D + kPad], unless QREG), two stages of K
// ([KEYS][D + kPad]) and of V ([KEYS][DV + kPad]), then (split 2) each
// warp's partial scores ([WARPS][KEYS / 8][32 lanes] of float4).
template <int D, int SPLIT>
constexpr size_t smem_bytes() {
  using S = Shape<D, SPLIT>;
  const size_t q = S::QREG ? 0 : size_t(kRows) * (D + kPad);
  const size_t partials = SPLIT == 1 ? 0 : size_t(S::WARPS) * (S::KEYS / 8) * 32 * 4;
  return (q + size_t(2) * S::KEYS * (D + kPad) + size_t(2) * S::KEYS * (S::DV + kPad)) *
             sizeof(uint16_t) +
         partials * sizeof(float);
}

// lo, hi rounded to bf16 (nearest even) as one mma operand register, lo in
// the low half.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
  return r;
}

// The SPLIT warps of slab `slab` meet (named barrier 1 + slab; 0 is
// __syncthreads').
template <int SPLIT>
__device__ __forceinline__ void slab_barrier(int slab) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + slab), "r"(SPLIT * 32) : "memory");
}

__device__ __forceinline__ int warp_min(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Keys [kb, kb + KEYS) of the sequence's kv head into stage `st` as stored
// (K: all D dims; V: dims [d0, d0 + DV)), 16 bytes a copy, one paged row
// lookup per key and column chunk; keys outside [range_lo, key_hi) are
// zeros and never read. One cp.async group.
template <int D, int SPLIT>
__device__ __forceinline__ void fill_tile(const PagedRows& rows, const PagedAttention& p,
                                          uint16_t* k_smem, uint16_t* v_smem, int range_lo,
                                          int key_hi, int kb, int d0, int st) {
  using S = Shape<D, SPLIT>;
  constexpr int kp = D + kPad, vp = S::DV + kPad, chunks = D / 8, v_chunks = S::DV / 8;
  constexpr int threads = S::WARPS * 32;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v_base);
  uint16_t* ks = k_smem + st * S::KEYS * kp;
  uint16_t* vs = v_smem + st * S::KEYS * vp;
  static_assert(S::KEYS * chunks % threads == 0, "whole copy rounds");
#pragma unroll
  for (int round = 0; round < S::KEYS * chunks / threads; ++round) {
    const int i = int(threadIdx.x) + round * threads;
    const int key = i / chunks, c = 8 * (i % chunks), j = kb + key;
    const bool ok = j >= range_lo && j < key_hi;
    const size_t row = ok ? rows.row(j) : 0;
    cp_async16(ks + key * kp + c, kbase + row + c, ok);
    // The V chunk of these columns, when they are among the block's DV
    // (all of them unless D > DV).
    const int vc = c - d0;
    if (vc >= 0 && vc < S::DV) cp_async16(vs + key * vp + vc, vbase + row + c, ok);
  }
  static_assert(v_chunks <= chunks, "V's columns are a part of K's");
  cp_async_commit();
}

// grid: (heads, tiles, D / DV); block (h, y, z) takes query tile
// n_tiles - 1 - y and output dims [z · DV, (z + 1) · DV).
template <int D, int SPLIT>
__global__ void __launch_bounds__(Shape<D, SPLIT>::WARPS * 32, Shape<D, SPLIT>::BLOCKS)
    prefill_attention_bf16_kernel(const float* q, StepLayout at, PagedAttention p,
                                  const int32_t* __restrict__ tiles, float* __restrict__ out) {
  using S = Shape<D, SPLIT>;
  constexpr int DV = S::DV, KEYS = S::KEYS, WARPS = S::WARPS, DW = S::DW, OW = S::OW;
  constexpr int kp = D + kPad, vp = DV + kPad, NT = KEYS / 8, NO = OW / 8, KS = DW / 16;
  extern __shared__ __align__(16) uint8_t shared_raw[];
  __shared__ int warp_range[2][WARPS];
  pdl_launch_dependents();
  pdl_wait();
  uint16_t* q_smem = reinterpret_cast<uint16_t*>(shared_raw);  // unless QREG
  uint16_t* k_smem = q_smem + (S::QREG ? 0 : kRows * kp);
  uint16_t* v_smem = k_smem + 2 * KEYS * kp;
  float4* partials = reinterpret_cast<float4*>(v_smem + 2 * KEYS * vp);  // split 2
  const int tile = int(gridDim.y - 1 - blockIdx.y);
  const int t0 = tiles[2 * tile], rows = tiles[2 * tile + 1] - t0;
  const int h = int(blockIdx.x), kvh = h / int(p.heads / p.kv_heads);
  const int d0 = int(blockIdx.z) * DV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The warp's rows, and its dims [part · DW, + DW) (0 without a split, which
  // the compiler is told: it does not know warp < kSlabs).
  const int slab = SPLIT == 1 ? warp : warp % kSlabs, part = SPLIT == 1 ? 0 : warp / kSlabs;
  const int g = lane / 4, tq = lane % 4;      // mma fragment coordinates
  const int mat = lane / 8, mrow = lane % 8;  // ldmatrix: lane l gives row l % 8 of matrix l / 8
  const int q_dim = int(p.heads) * D;
  const bool capped = p.softcap > 0.f;
  // Scores come out in log2 units: log2(e) rides on q·scale, or on the
  // soft-cap's outer factor (the cap itself acts on natural units).
  const float q_scale = capped ? p.scale : p.scale * kLog2e;
  const float cap_out = p.softcap * kLog2e, cap_in = capped ? 1.f / p.softcap : 0.f;

  // This lane's rows r0 = g and r1 = g + 8 of the warp's 16: key ranges
  // (rows past the tile: none).
  const int r0 = slab * 16 + g, r1 = r0 + 8;
  int lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
  if (r0 < rows) {
    lo0 = int(first_key(at, p, t0 + r0));
    hi0 = int(at.key_end[t0 + r0]);
  }
  if (r1 < rows) {
    lo1 = int(first_key(at, p, t0 + r1));
    hi1 = int(at.key_end[t0 + r1]);
  }
  // q·scale in bf16 as A fragments for every 16-dim step of the warp's
  // dims: in registers for the whole pass (QREG), else the warp's 16 rows and
  // DW dims in shared memory, which only this warp reads.
  uint32_t qa[S::QREG ? KS : 1][4];
  if constexpr (S::QREG) {
    const float* q0 = q + size_t(t0 + r0) * q_dim + h * D + part * DW + 2 * tq;
    const float* q1 = q0 + size_t(8) * q_dim;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      float2 a = make_float2(0.f, 0.f), b = a, c = a, d = a;
      if (r0 < rows) {
        a = *reinterpret_cast<const float2*>(q0 + 16 * ks);
        c = *reinterpret_cast<const float2*>(q0 + 16 * ks + 8);
      }
      if (r1 < rows) {
        b = *reinterpret_cast<const float2*>(q1 + 16 * ks);
        d = *reinterpret_cast<const float2*>(q1 + 16 * ks + 8);
      }
      qa[ks][0] = bf16x2(a.x * q_scale, a.y * q_scale);
      qa[ks][1] = bf16x2(b.x * q_scale, b.y * q_scale);
      qa[ks][2] = bf16x2(c.x * q_scale, c.y * q_scale);
      qa[ks][3] = bf16x2(d.x * q_scale, d.y * q_scale);
    }
  } else {
    for (int i = lane; i < 16 * (DW / 2); i += 32) {
      const int r = slab * 16 + i / (DW / 2), c = part * DW + 2 * (i % (DW / 2));
      float2 v = make_float2(0.f, 0.f);
      if (r < rows) v = *reinterpret_cast<const float2*>(q + size_t(t0 + r) * q_dim + h * D + c);
      *reinterpret_cast<uint32_t*>(q_smem + r * kp + c) = bf16x2(v.x * q_scale, v.y * q_scale);
    }
    __syncwarp();
  }
  const uint16_t* qw = q_smem + (slab * 16 + g) * kp + part * DW + 2 * tq;  // !QREG: row g's words
  // The warp's rows that see keys: the union of their ranges (tiles outside
  // it are skipped) and their intersection (tiles inside it need no mask).
  const bool has0 = hi0 > lo0, has1 = hi1 > lo1;
  const int warp_lo = warp_min(min(has0 ? lo0 : INT_MAX, has1 ? lo1 : INT_MAX));
  const int warp_hi = warp_max(max(has0 ? hi0 : 0, has1 ? hi1 : 0));
  const int all_lo = warp_max(max(has0 ? lo0 : 0, has1 ? lo1 : 0));
  const int all_hi = warp_min(min(has0 ? hi0 : INT_MAX, has1 ? hi1 : INT_MAX));
  if (lane == 0) {
    warp_range[0][warp] = warp_lo;
    warp_range[1][warp] = warp_hi;
  }
  __syncthreads();
  int range_lo = INT_MAX, key_hi = 0;  // the block's keys
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    range_lo = min(range_lo, warp_range[0][w]);
    key_hi = max(key_hi, warp_range[1][w]);
  }
  // Tiles start at multiples of KEYS; keys below range_lo are never read (a
  // sliding layer's table may no longer hold their blocks).
  const int key_lo = range_lo >= key_hi ? key_hi : range_lo / KEYS * KEYS;
  const PagedRows src = paged_rows(at, p, t0, kvh);

  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;  // log2 units; this lane's part of l

  int st = 0;  // the stage holding the current tile
  if (key_lo < key_hi) fill_tile<D, SPLIT>(src, p, k_smem, v_smem, range_lo, key_hi, key_lo, d0, 0);
  for (int kb = key_lo; kb < key_hi; kb += KEYS) {
    if (kb + KEYS < key_hi) {
      fill_tile<D, SPLIT>(src, p, k_smem, v_smem, range_lo, key_hi, kb + KEYS, d0, st ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* ks_tile = k_smem + st * KEYS * kp;
    const uint16_t* vs_tile = v_smem + st * KEYS * vp;
    // Some key of this tile for these rows (the same answer for the warps
    // of a slab, which meet in slab_barrier).
    if (kb < warp_hi && kb + KEYS > warp_lo) {
      // S = q · kᵀ for the warp's 16 rows and the tile's keys over its DW
      // dims: two key n-tiles' B fragments per ldmatrix_x4 (keys + 8 ·
      // (mat / 2), dims + 8 · (mat % 2)).
      float s[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t a[4];
        if constexpr (S::QREG) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = qa[ks][e];
        } else {
          a[0] = *reinterpret_cast<const uint32_t*>(qw + 16 * ks);
          a[1] = *reinterpret_cast<const uint32_t*>(qw + 8 * kp + 16 * ks);
          a[2] = *reinterpret_cast<const uint32_t*>(qw + 16 * ks + 8);
          a[3] = *reinterpret_cast<const uint32_t*>(qw + 8 * kp + 16 * ks + 8);
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, ks_tile + (np * 16 + 8 * (mat / 2) + mrow) * kp + part * DW + ks * 16 +
                             8 * (mat % 2));
          mma(s[2 * np], a, b[0], b[1]);
          mma(s[2 * np + 1], a, b[2], b[3]);
        }
      }
      if constexpr (SPLIT > 1) {
        // The slab's partial scores summed in part order, so its warps hold
        // the same scores, weights and row sums. The buffer is rewritten only
        // after the __syncthreads ending this tile.
#pragma unroll
        for (int n = 0; n < NT; ++n)
          partials[(warp * NT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
        slab_barrier<SPLIT>(slab);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
          for (int w = slab; w < WARPS; w += kSlabs) {
            const float4 x = partials[(w * NT + n) * 32 + lane];
            s[n][0] += x.x;
            s[n][1] += x.y;
            s[n][2] += x.z;
            s[n][3] += x.w;
          }
        }
      }
      if (capped) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = cap_out * tanhf(s[n][e] * cap_in);
      }
      // Rows r0 (s[n][0..1]) and r1 (s[n][2..3]) keep keys of their range.
      if (!(kb >= all_lo && kb + KEYS <= all_hi)) {
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = kb + n * 8 + 2 * tq + (e & 1);
            const bool ok = e < 2 ? key >= lo0 && key < hi0 : key >= lo1 && key < hi1;
            if (!ok) s[n][e] = -INFINITY;
          }
      }
      online_softmax<NT, NO, true>(s, o, m0, m1, l0, l1);  // in log2 units
      // O += P · V over the warp's OW output dims: the weights of key
      // n-tiles 2kk, 2kk + 1 are the A operand of keys [16kk, 16kk + 16);
      // V's B fragments transposed by ldmatrix (keys + 8 · (mat % 2), dims +
      // 8 · (mat / 2)).
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        const uint32_t pa[4] = {
            bf16x2(s[2 * kk][0], s[2 * kk][1]), bf16x2(s[2 * kk][2], s[2 * kk][3]),
            bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]), bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int nd = 0; nd < NO / 2; ++nd) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vs_tile + (kk * 16 + 8 * (mat % 2) + mrow) * vp + part * OW +
                                   nd * 16 + 8 * (mat / 2));
          mma(o[2 * nd], pa, b[0], b[1]);
          mma(o[2 * nd + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with stage st before it is refilled
    st ^= 1;
  }
  store_warp_rows(p, out, o, l0, l1, r0, rows, int64_t(t0) * q_dim + h * D + d0 + part * OW, q_dim,
                  OW, tq);
}

template <int D, int SPLIT>
void launch_bf16_kernel(int64_t n_tiles, const float* q, const StepLayout& at,
                        const PagedAttention& p, const int32_t* tiles, float* out,
                        cudaStream_t stream) {
  using S = Shape<D, SPLIT>;
  const auto kernel = prefill_attention_bf16_kernel<D, SPLIT>;
  allow_opt_in_shared_memory(reinterpret_cast<const void*>(kernel));
  const dim3 grid{unsigned(p.heads), unsigned(n_tiles), unsigned(D / S::DV)};
  launch(kernel, grid, S::WARPS * 32, smem_bytes<D, SPLIT>(), stream, q, at, p, tiles, out);
}

// The split a head dim takes unless the caller asks for one: 2 at 512, 1
// below; TANDEM_CUDA_PREFILL_SPLIT=1 or 2 (read at each launch, for
// measuring) sets it at 256 and 512. On the H100: split 2 at 512 2.7x the
// kernel's speed and +18% Gemma 4 prefill of 4,096 tokens; at 256 +16% for
// the kernel on a causal prompt but -2% gemma-3-1b prefill (sliding
// layers), so 256 keeps split 1 (bench/results/cuda-opt-in-2026-12-05.md).
int default_split(int64_t head_dim) {
  if (head_dim < 256) return 1;
  if (env_is("TANDEM_CUDA_PREFILL_SPLIT", "1")) return 1;
  if (env_is("TANDEM_CUDA_PREFILL_SPLIT", "2")) return 2;
  return head_dim == 512 ? 2 : 1;
}

// The kernels built: calls f(D, SPLIT) as std::integral_constant values
// for the one of (head_dim, split) and returns true, or returns false where
// none is.
template <class F>
bool with_kernel(int64_t head_dim, int split, F&& f) {
  const auto call = [&](auto d, auto s) {
    if (head_dim != decltype(d)::value || split != decltype(s)::value) return false;
    f(d, s);
    return true;
  };
  using std::integral_constant;
  return call(integral_constant<int, 64>{}, integral_constant<int, 1>{}) ||
         call(integral_constant<int, 128>{}, integral_constant<int, 1>{}) ||
         call(integral_constant<int, 256>{}, integral_constant<int, 1>{}) ||
         call(integral_constant<int, 256>{}, integral_constant<int, 2>{}) ||
         call(integral_constant<int, 512>{}, integral_constant<int, 1>{}) ||
         call(integral_constant<int, 512>{}, integral_constant<int, 2>{});
}

// Shared memory of the kernel for (head_dim, split); 0: no such kernel.
size_t smem_for(int64_t head_dim, int split) {
  size_t smem = 0;
  with_kernel(head_dim, split,
              [&](auto d, auto s) { smem = smem_bytes<decltype(d)::value, decltype(s)::value>(); });
  return smem;
}

}  // namespace

bool attention_prefill_bf16_takes(const PagedAttention& p, int device, int split) {
  const size_t smem = smem_for(p.head_dim, split ? split : default_split(p.head_dim));
  if (!p.kv_bf16 || !p.bf16_inputs || smem == 0) return false;
  const LaunchLimits limits = launch_limits(device);
  return limits.cc_major >= 8 && smem <= limits.smem_optin;
}

void attention_prefill_bf16(const float* q, const StepLayout& at, const int32_t* tiles,
                            int64_t n_tiles, const PagedAttention& p, float* out,
                            cudaStream_t stream, int split) {
  if (n_tiles <= 0) return;
  if (p.out_quantized)
    fail(
        "attention_prefill_bf16: quantized output rows (out_quantized) are the decode kernels' "
        "only");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (!split) split = default_split(p.head_dim);
  if (!attention_prefill_bf16_takes(p, device, split) || p.kv_heads <= 0 ||
      p.heads % p.kv_heads != 0)
    fail(
        "attention_prefill_bf16: head_dim %lld, split %d, heads %lld / kv_heads %lld, kv_bf16 "
        "%d, bf16_inputs %d unsupported on this device",
        (long long)p.head_dim, split, (long long)p.heads, (long long)p.kv_heads, int(p.kv_bf16),
        int(p.bf16_inputs));
  if (p.block_size <= 0 || (p.block_size & (p.block_size - 1)) != 0)
    fail("attention_prefill_bf16: block_size %lld is not a power of two", (long long)p.block_size);
  PagedAttention pp = p;
  pp.block_shift = 0;
  while ((int64_t(1) << pp.block_shift) < p.block_size) ++pp.block_shift;
  with_kernel(p.head_dim, split, [&](auto d, auto s) {
    launch_bf16_kernel<decltype(d)::value, decltype(s)::value>(n_tiles, q, at, pp, tiles, out,
                                                               stream);
  });
}

}  // namespace tandem::cuda
