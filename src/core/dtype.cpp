#include "core/dtype.h"

#include <cmath>

namespace tandem {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
    case DType::U32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::U8:
    case DType::F8_E4M3:
    case DType::F8_E5M2: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::U32: return "U32";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kTable[] = {{"F32", DType::F32}, {"F16", DType::F16},         {"BF16", DType::BF16},
                {"I32", DType::I32}, {"I64", DType::I64},         {"U8", DType::U8},
                {"U32", DType::U32}, {"F8_E4M3", DType::F8_E4M3}, {"F8_E5M2", DType::F8_E5M2}};
  for (const auto& e : kTable)
    if (e.name == name) {
      *out = e.type;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // overflow -> inf
  if (abs < 0x38800000u) {                       // subnormal or zero
    if (abs < 0x33000000u) return sign;          // rounds to zero
    uint32_t exp = abs >> 23;
    uint32_t man = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exp;  // 14..24
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t out = man >> shift;
    if (rest > half || (rest == half && (out & 1))) ++out;
    return sign | uint16_t(out);
  }
  uint32_t out = ((abs >> 13) - (112u << 10));
  uint32_t rest = abs & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (out & 1))) ++out;
  return sign | uint16_t(out);
}

float round_to_dtype(float f, DType t) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(f));
    case DType::F16: return f16_to_f32(f32_to_f16(f));
    default: return f;
  }
}

}  // namespace tandem
