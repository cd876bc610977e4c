// Reading and writing the paged KV rows in either of their types (device
// code, for the .cu files): f32, or bf16 (PagedAttention::kv_bf16), whose
// values are rounded to nearest even as core/dtype.h's f32_to_bf16 does, so
// the CPU reference can round its copy the same way.
#pragma once

#include <cstdint>

namespace tandem::cuda {

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

__device__ __forceinline__ float bf16_low(uint32_t w) {
  return __uint_as_float(w << 16);
}
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
  return make_float4(bf16_low(v.x), bf16_high(v.x), bf16_low(v.y), bf16_high(v.y));
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
    return bf16_low(static_cast<const uint16_t*>(base)[i]);
  else
    return static_cast<const float*>(base)[i];
}

// The bf16 bits of f, rounded to nearest even (NaN stays a quiet NaN).
__device__ __forceinline__ uint16_t kv_bf16_bits(float f) {
  const uint32_t b = __float_as_uint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x40u);
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// base[i] = v, in the rows' type.
__device__ __forceinline__ void kv_store(void* base, int64_t i, float v, bool bf16) {
  if (bf16)
    static_cast<uint16_t*>(base)[i] = kv_bf16_bits(v);
  else
    static_cast<float*>(base)[i] = v;
}

}  // namespace tandem::cuda
