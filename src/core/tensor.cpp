#include "core/tensor.h"

#include "core/error.h"

namespace tandem {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

float load_as_f32(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default:
      fail("load_as_f32: dtype %s is not a float type", std::string(dtype_name(dtype)).c_str());
  }
}

void convert_to_f32(const void* src, DType dtype, int64_t n, float* dst) {
  switch (dtype) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<const float*>(src)[i];
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
      return;
    default:
      fail("convert_to_f32: dtype %s is not a float type", std::string(dtype_name(dtype)).c_str());
  }
}

}  // namespace tandem
