// Tensor-core building blocks of the attention kernels (device code, for
// the .cu files, sm_80+): bf16 hi/lo splitting of f32 values, mma.sync
// m16n8k16 (bf16 in, f32 accumulate), ldmatrix fragment loads and cp.async
// copies into shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

namespace tandem::cuda {

__device__ __forceinline__ uint32_t bf16_bits(float f) {  // round to nearest even
  const uint32_t b = __float_as_uint(f);
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_value(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
// The bf16 hi and lo parts of x.
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  hi = bf16_bits(x);
  lo = bf16_bits(x - bf16_value(hi));
}
// Two columns' parts packed as an mma operand register (lower column in the
// low half).
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  uint32_t h0, l0, h1, l1;
  split(x0, h0, l0);
  split(x1, h1, l1);
  hi = h0 | (h1 << 16);
  lo = l0 | (l1 << 16);
}

// d += a · b, m16n8k16, bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d += a · b as parts: hi·hi + hi·lo + lo·hi (lo·lo is below f32
// rounding); B_EXACT: b is a bf16 value (its lo part is zero), so hi·hi +
// lo·hi; A_EXACT: a is taken as its bf16 hi part alone (no lo·hi).
template <bool B_EXACT, bool A_EXACT = false>
__device__ __forceinline__ void mma_parts(float (&d)[4], const uint32_t (&ahi)[4],
                                          const uint32_t (&alo)[4], uint32_t bh0, uint32_t bh1,
                                          uint32_t bl0, uint32_t bl1) {
  mma(d, ahi, bh0, bh1);
  if constexpr (!B_EXACT) mma(d, ahi, bl0, bl1);
  if constexpr (!A_EXACT) mma(d, alo, bh0, bh1);
}

// The shared-memory address of a generic pointer into it (PTX operands).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices from shared memory, lane l giving the address of
// row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); lane t receives
// row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 of each (transposed: rows
// 2 (t % 4), 2 (t % 4) + 1 of column t / 4) — an mma B fragment each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = shared_address(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = shared_address(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// 16 bytes global -> shared without passing through registers; zeros when
// !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(uint16_t* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = shared_address(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src),
               "r"(valid ? 16 : 0));
#endif
}
// BYTES (4, 8 or 16; src and dst aligned to it) global -> shared through
// L1 (cp.async.ca: the sizes below 16 bytes).
template <int BYTES>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "n"(BYTES));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Bulk copies into shared memory that complete on an mbarrier (sm_90; the
// non-tensor form of the tensor memory accelerator): one instruction moves
// a whole row, where cp_async16 takes one per 16 bytes. A barrier is
// initialized once with one expected arrival; each phase is armed by one
// thread with the bytes its copies bring (mbarrier_expect_tx), and threads
// wait for that phase's parity (mbarrier_wait), after which the copied
// bytes are visible to them. Addresses and sizes: multiples of 16 bytes.

// Orders this thread's earlier shared-memory reads before bulk copies it
// issues next into the same bytes (the copies write through the async proxy).
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbarrier_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(bar)));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
  fence_async_shared();  // the copies' async proxy sees the initialized barrier
}
__device__ __forceinline__ void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)),
      "r"(bytes)
      : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, "
        "p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}

// Stages ROWS query rows of DH values (rows past G zeros) as q·scale in
// bf16 hi/lo parts into shared memory rows of `pitch` (q_lo not written
// when HI_ONLY), by the THREADS threads of the caller (thread index `i`),
// up to eight loads in flight per thread (one at a time, each paid the L2
// latency in series).
template <int ROWS, int DH, int THREADS, bool HI_ONLY>
__device__ __forceinline__ void stage_q_parts(const float* q, int G, float scale, uint16_t* q_hi,
                                              uint16_t* q_lo, int pitch, int i) {
  constexpr int kSteps = ROWS * (DH / 2) / THREADS, kBatch = kSteps < 8 ? kSteps : 8;
  static_assert(ROWS * (DH / 2) % THREADS == 0 && kSteps % kBatch == 0, "whole q batches");
  for (int s0 = 0; s0 < kSteps; s0 += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = i + THREADS * (s0 + j), r = k / (DH / 2), c = 2 * (k % (DH / 2));
      v[j] = r < G ? *reinterpret_cast<const float2*>(q + r * DH + c) : make_float2(0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = i + THREADS * (s0 + j), r = k / (DH / 2), c = 2 * (k % (DH / 2));
      uint32_t h2, l2;
      split2(v[j].x * scale, v[j].y * scale, h2, l2);
      *reinterpret_cast<uint32_t*>(q_hi + r * pitch + c) = h2;
      if constexpr (!HI_ONLY) *reinterpret_cast<uint32_t*>(q_lo + r * pitch + c) = l2;
    }
  }
}

// One warp's flash-attention steps over an mma tile of 16 query rows:
// lane l holds rows g = l / 4 and g + 8 of the score and output fragments
// (s[n][0..1], o[n][0..1] for row g; [2..3] for row g + 8), columns
// 8n + 2 (l % 4) and + 1.

// s[n] += q · kᵀ for keys [8n, 8n + 8), n < NT (NT even), over `dims`
// (a multiple of 16): q as hi/lo parts, rows of q_pitch values from the
// warp's first row; k as rows of keys (k_lo unused when B_EXACT: the keys
// are bf16 values).
// UPPER false: rows 8-15 are not stored (their scores come out 0).
// A_EXACT: q is its hi part alone (q_lo unused): one product fewer.
template <bool B_EXACT, int NT, bool UPPER = true, bool A_EXACT = false>
__device__ __forceinline__ void warp_scores(float (&s)[NT][4], const uint16_t* q_hi,
                                            const uint16_t* q_lo, int q_pitch, const uint16_t* k_hi,
                                            const uint16_t* k_lo, int k_pitch, int dims) {
  const int lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int mat = lane / 8, mrow = lane % 8;  // ldmatrix: lane l reads row l % 8 of matrix l / 8
  const uint16_t* qh = q_hi + g * q_pitch + 2 * tq;
  const uint16_t* ql = q_lo + g * q_pitch + 2 * tq;
#pragma unroll 4
  for (int k = 0; k < dims; k += 16) {
    uint32_t ah[4] = {0u, 0u, 0u, 0u}, al[4] = {0u, 0u, 0u, 0u};
    ah[0] = *reinterpret_cast<const uint32_t*>(qh + k);
    ah[2] = *reinterpret_cast<const uint32_t*>(qh + k + 8);
    if constexpr (!A_EXACT) {
      al[0] = *reinterpret_cast<const uint32_t*>(ql + k);
      al[2] = *reinterpret_cast<const uint32_t*>(ql + k + 8);
    }
    if constexpr (UPPER) {
      ah[1] = *reinterpret_cast<const uint32_t*>(qh + 8 * q_pitch + k);
      ah[3] = *reinterpret_cast<const uint32_t*>(qh + 8 * q_pitch + k + 8);
      if constexpr (!A_EXACT) {
        al[1] = *reinterpret_cast<const uint32_t*>(ql + 8 * q_pitch + k);
        al[3] = *reinterpret_cast<const uint32_t*>(ql + 8 * q_pitch + k + 8);
      }
    }
    // Two n-tiles' B fragments per ldmatrix_x4: keys + 8 · (mat / 2), dims
    // + 8 · (mat % 2).
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int at = (np * 16 + 8 * (mat / 2) + mrow) * k_pitch + k + 8 * (mat % 2);
      uint32_t bh[4], bl[4] = {0u, 0u, 0u, 0u};
      ldmatrix_x4(bh, k_hi + at);
      if constexpr (!B_EXACT) ldmatrix_x4(bl, k_lo + at);
      mma_parts<B_EXACT, A_EXACT>(s[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
      mma_parts<B_EXACT, A_EXACT>(s[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
    }
  }
}

// 2^x on the special-function unit (inputs below -126 give 0, -inf gives 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// e^x, or 2^x when the scores are in log2 units (LOG2).
template <bool LOG2>
__device__ __forceinline__ float softmax_exp(float x) {
  if constexpr (LOG2)
    return exp2_approx(x);
  else
    return expf(x);
}

// The online softmax over a tile of masked scores (masked: -inf): raises
// the rows' running max m0, m1, rescales their sums l0, l1 (this lane's
// part) and outputs o, and turns s into the weights exp(s - max). A row's 4
// lanes share its max. LOG2: scores, and so m0, m1, are in log2 units (the
// caller folded log2(e) into them), the weights 2^(s - max), one ex2 each.
template <int NT, int NO, bool LOG2 = false>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[NO][4], float& m0,
                                               float& m1, float& l0, float& l1) {
  float mx0 = -FLT_MAX, mx1 = -FLT_MAX;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
  }
  const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
  const float c0 = softmax_exp<LOG2>(m0 - n0),
              c1 = softmax_exp<LOG2>(m1 - n1);  // 1 while a row has seen nothing
  m0 = n0;
  m1 = n1;
  l0 *= c0;
  l1 *= c1;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    o[n][0] *= c0;
    o[n][1] *= c0;
    o[n][2] *= c1;
    o[n][3] *= c1;
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][0] = softmax_exp<LOG2>(s[n][0] - n0);  // masked: exp(-inf) = 0
    s[n][1] = softmax_exp<LOG2>(s[n][1] - n0);
    s[n][2] = softmax_exp<LOG2>(s[n][2] - n1);
    s[n][3] = softmax_exp<LOG2>(s[n][3] - n1);
    l0 += s[n][0] + s[n][1];
    l1 += s[n][2] + s[n][3];
  }
}

// o[n] += P · V for dims [8n, 8n + 8), n < NO (NO even), over the tile's
// NT · 8 keys: the weights s as hi/lo parts (n-tiles 2kk, 2kk + 1 are the A
// operand of keys [16kk, 16kk + 16)); V as rows of keys of v_pitch values
// (v_lo unused when B_EXACT), its B fragments transposed by
// ldmatrix_x4_trans, two dim n-tiles each (keys + 8 · (mat % 2), dims + 8 ·
// (mat / 2)).
// A_EXACT: the weights rounded to bf16 (their hi part alone).
template <bool B_EXACT, int NT, int NO, bool A_EXACT = false>
__device__ __forceinline__ void warp_weighted_values(float (&o)[NO][4], const float (&s)[NT][4],
                                                     const uint16_t* v_hi, const uint16_t* v_lo,
                                                     int v_pitch) {
  const int lane = threadIdx.x % 32, mat = lane / 8, mrow = lane % 8;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    uint32_t ph[4], pl[4];
    split2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
    split2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
    split2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
    split2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
    for (int nd = 0; nd < NO / 2; ++nd) {
      const int at = (kk * 16 + 8 * (mat % 2) + mrow) * v_pitch + nd * 16 + 8 * (mat / 2);
      uint32_t bh[4], bl[4] = {0u, 0u, 0u, 0u};
      ldmatrix_x4_trans(bh, v_hi + at);
      if constexpr (!B_EXACT) ldmatrix_x4_trans(bl, v_lo + at);
      mma_parts<B_EXACT, A_EXACT>(o[2 * nd], ph, pl, bh[0], bh[1], bl[0], bl[1]);
      mma_parts<B_EXACT, A_EXACT>(o[2 * nd + 1], ph, pl, bh[2], bh[3], bl[2], bl[3]);
    }
  }
}

}  // namespace tandem::cuda
