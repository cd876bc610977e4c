// The paged KV rows for the attention kernels (device code, for the .cu
// files): where a token's keys live and which of them it (or one of its key
// splits) reads; and reading and writing the rows in either of their
// types: f32, or bf16 (PagedAttention::kv_bf16), whose values are rounded
// to nearest even as core/dtype.h's f32_to_bf16 does, so the CPU reference
// can round its copy the same way.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.h"

namespace tandem::cuda {

// An attention output value out[i] (and its bf16 twin when
// PagedAttention::out_bf16 is set); store_out2: values i and i + 1 (i even).
__device__ __forceinline__ void store_out(const PagedAttention& p, float* out, int64_t i, float v) {
  out[i] = v;
  if (p.out_bf16) p.out_bf16[i] = uint16_t(bf16_bits(v));
}
__device__ __forceinline__ void store_out2(const PagedAttention& p, float* out, int64_t i, float a,
                                           float b) {
  *reinterpret_cast<float2*>(out + i) = make_float2(a, b);
  if (p.out_bf16)
    *reinterpret_cast<uint32_t*>(p.out_bf16 + i) = bf16_bits(a) | (bf16_bits(b) << 16);
}

// The end of a warp's flash-attention pass over 16 query rows (mma.h's
// fragment layout): each row's sum l over its 4 lanes, then this lane's
// rows r0 (o[n][0..1]) and r0 + 8 (o[n][2..3]) that are below `rows`,
// normalized by their sums (rows with no key give 0), to out[first + r ·
// pitch + 8n + 2tq] for the n where 8n + 2tq < dims.
template <int NO>
__device__ __forceinline__ void store_warp_rows(const PagedAttention& p, float* out,
                                                const float (&o)[NO][4], float l0, float l1, int r0,
                                                int rows, int64_t first, int64_t pitch, int dims,
                                                int tq) {
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  const int64_t at0 = first + r0 * pitch, at1 = at0 + 8 * pitch;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int d = n * 8 + 2 * tq;
    if (d >= dims) break;
    if (r0 < rows) store_out2(p, out, at0 + d, o[n][0] * inv0, o[n][1] * inv0);
    if (r0 + 8 < rows) store_out2(p, out, at1 + d, o[n][2] * inv1, o[n][3] * inv1);
  }
}

// A sequence's rows of one kv head in a layer's paged storage: key j is row
// j % block_size of block table[j / block_size] (the table already shifted
// by the sequence's first block on sliding layers), at `head_offset` values
// into a row of kv_dim values.
struct PagedRows {
  const int32_t* table;
  int shift;  // log2(block_size)
  int kv_dim, head_offset;
  // The offset of key j's row, in values (32-bit index math for int keys).
  __device__ __forceinline__ size_t row(int64_t j) const {
    return size_t(((int64_t(table[j >> shift]) << shift) + (j & ((int64_t(1) << shift) - 1))) *
                      int64_t(kv_dim) +
                  int64_t(head_offset));
  }
  __device__ __forceinline__ size_t row(int j) const {
    return (size_t(uint32_t(table[j >> shift])) << shift | size_t(j & ((1 << shift) - 1))) *
               size_t(kv_dim) +
           size_t(head_offset);
  }
};

// Token t's rows of kv head kvh (p.block_shift set).
__device__ __forceinline__ PagedRows paged_rows(const StepLayout& at, const PagedAttention& p,
                                                int64_t t, int64_t kvh) {
  const int64_t s = at.seq[t];
  return PagedRows{at.tables + at.table_start[s] - (at.first_block ? at.first_block[s] : 0),
                   p.block_shift, int(p.kv_heads * p.head_dim), int(kvh * p.head_dim)};
}

// The first key token t attends: the start of its window, else 0.
__device__ __forceinline__ int64_t first_key(const StepLayout& at, const PagedAttention& p,
                                             int64_t t) {
  const int64_t pos = at.positions[t];
  return p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
}

// The keys [first, end) of split `split` of p.splits for token t: its keys
// [first_key, key_end) cut in chunks of equal length (the last ones may be
// short or empty).
struct KeyRange {
  int64_t first, end;
};
__device__ __forceinline__ KeyRange split_keys(const StepLayout& at, const PagedAttention& p,
                                               int64_t t, int split) {
  const int64_t lo = first_key(at, p, t), hi = at.key_end[t];
  const int64_t chunk = (hi - lo + p.splits - 1) / p.splits;
  const int64_t first = lo + split * chunk;
  return KeyRange{first, first + chunk < hi ? first + chunk : hi};
}

// Split `split`'s partial of (token t, head h) in p.partial: its running
// max m, sum l and unnormalized output o, as [m, l, o[0..dim)] (the layout
// the split combine reads: a (t, h)'s splits back to back).
__device__ __forceinline__ float* split_partial(const PagedAttention& p, int64_t t, int64_t h,
                                                int split, int64_t dim) {
  return p.partial + ((t * p.heads + h) * p.splits + split) * (dim + 2);
}

// One query row of a warp's mma output fragment — o[n][2·half] and
// o[n][2·half + 1] hold dims dim0 + 8n + 2·tq and + 1 (n < NO) — for head
// h of token t: normalized by its sum l into out when `whole` (the row has
// seen every key: p.splits == 1, or its splits are merged already), else
// unnormalized into split `split`'s partial, whose m and l the lane with
// `writes_ml` stores.
template <int NO>
__device__ __forceinline__ void store_row_fragment(const PagedAttention& p, float* out,
                                                   const float (&o)[NO][4], int half, float m,
                                                   float l, int64_t t, int64_t h, int split,
                                                   int64_t dim, int64_t dim0, int tq,
                                                   bool writes_ml, bool whole) {
  if (whole) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t at = (t * p.heads + h) * dim + dim0 + 2 * tq;
#pragma unroll
    for (int n = 0; n < NO; ++n)
      store_out2(p, out, at + n * 8, o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    return;
  }
  float* part = split_partial(p, t, h, split, dim);
  if (writes_ml) {
    part[0] = m;
    part[1] = l;
  }
#pragma unroll
  for (int n = 0; n < NO; ++n)  // (dim + 2) even: every pair is 8-byte aligned
    *reinterpret_cast<float2*>(part + 2 + dim0 + n * 8 + 2 * tq) =
        make_float2(o[n][2 * half], o[n][2 * half + 1]);
}

// Four consecutive values as raw registers: float4 for f32 rows, uint2 (four
// bf16) for bf16 ones, so a bf16 tile held for the next iteration takes
// half the registers.
template <bool BF16>
struct KvRaw4;
template <>
struct KvRaw4<false> {
  using type = float4;
};
template <>
struct KvRaw4<true> {
  using type = uint2;
};

// The upper of two bf16 values packed in a word (mma.h's bf16_value takes the
// lower).
__device__ __forceinline__ float bf16_high(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

// Values [off, off + 4) of `base` (off a multiple of 4).
template <bool BF16>
__device__ __forceinline__ typename KvRaw4<BF16>::type kv_load4(const void* base, int64_t off) {
  if constexpr (BF16)
    return *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + off);
  else
    return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + off);
}
__device__ __forceinline__ float4 kv_widen(float4 v) {
  return v;
}
__device__ __forceinline__ float4 kv_widen(uint2 v) {
  return make_float4(bf16_value(v.x), bf16_high(v.x), bf16_value(v.y), bf16_high(v.y));
}
template <bool BF16>
__device__ __forceinline__ typename KvRaw4<BF16>::type kv_zero4() {
  if constexpr (BF16)
    return make_uint2(0u, 0u);
  else
    return make_float4(0.f, 0.f, 0.f, 0.f);
}

// Value `i` of `base`.
template <bool BF16>
__device__ __forceinline__ float kv_load(const void* base, int64_t i) {
  if constexpr (BF16)
    return bf16_value(static_cast<const uint16_t*>(base)[i]);
  else
    return static_cast<const float*>(base)[i];
}

// The bf16 bits of f, rounded to nearest even (mma.h's bf16_bits), NaN
// kept a quiet NaN.
__device__ __forceinline__ uint16_t kv_bf16_bits(float f) {
  const uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40u);
  return uint16_t(bf16_bits(f));
}

// base[i] = v, in the rows' type.
__device__ __forceinline__ void kv_store(void* base, int64_t i, float v, bool bf16) {
  if (bf16)
    static_cast<uint16_t*>(base)[i] = kv_bf16_bits(v);
  else
    static_cast<float*>(base)[i] = v;
}

}  // namespace tandem::cuda
