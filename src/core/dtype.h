// Element types of weights and activations, and scalar conversions.
//
// Contract: conversions are bit-exact with PyTorch's: bf16 -> f32 is a shift,
// f32 -> bf16 rounds to nearest even (NaN stays NaN), f16 follows IEEE 754.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tandem {

// U32 holds packed quantized codes (MLX); F8_E4M3 / F8_E5M2 are float8 weights
// (only E4M3 is read, dequantized at load — see core/quant.h).
enum class DType : uint8_t { F32, F16, BF16, I32, I64, U8, U32, F8_E4M3, F8_E5M2 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype name; false when the name is unknown.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Rounds f to the nearest value representable in `t` (F32: unchanged).
float round_to_dtype(float f, DType t);

}  // namespace tandem
