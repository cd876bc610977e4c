#include "core/quant.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tandem {

namespace {

void store_scalar(void* base, int64_t i, float v, DType t) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = v; return;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); return;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); return;
    default:
      fail("affine quantization: scale dtype %s is not F32, F16 or BF16",
           std::string(dtype_name(t)).c_str());
  }
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80) << 24;
  const uint32_t exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  float mag;
  if (exp == 0)
    mag = std::ldexp(float(man), -9);  // subnormal: man/8 · 2^-6
  else
    mag = std::ldexp(float(8 + man), int(exp) - 10);  // (1 + man/8) · 2^(exp-7)
  uint32_t bits;
  std::memcpy(&bits, &mag, 4);
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

namespace {

// v rounded to D (MLX's arithmetic in the weight's dtype).
template <DType D>
inline float round_to(float v) {
  if constexpr (D == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if constexpr (D == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

template <DType D>
void quantize_groups(const float* w, int64_t cols, int bits, int group_size, uint32_t* codes,
                     void* scales, void* biases) {
  const float n_bins = float((1 << bits) - 1);
  const int per_word = 32 / bits;
  const float eps = round_to<D>(1e-7f);
  for (int64_t g = 0; g < cols / group_size; ++g) {
    const float* x = w + g * group_size;
    float lo = round_to<D>(x[0]), hi = lo;
    for (int i = 1; i < group_size; ++i) {
      const float v = round_to<D>(x[i]);
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
    const bool lo_edge = std::fabs(lo) > std::fabs(hi);
    float scale = round_to<D>(round_to<D>(hi - lo) / n_bins);
    scale = scale > eps ? scale : eps;
    if (!lo_edge) scale = -scale;
    const float edge = lo_edge ? lo : hi;
    const float q0 = std::nearbyint(round_to<D>(edge / scale));
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = round_to<D>(edge / q0);
      bias = edge;
    }
    store_scalar(scales, g, scale, D);
    store_scalar(biases, g, bias, D);
    for (int i = 0; i < group_size; ++i) {
      float q = std::nearbyint(round_to<D>(round_to<D>(round_to<D>(x[i]) - bias) / scale));
      if (!(q >= 0.0f)) q = 0.0f;  // also NaN
      if (q > n_bins) q = n_bins;
      const int64_t k = g * group_size + i;
      codes[k / per_word] |= uint32_t(q) << (bits * (k % per_word));
    }
  }
}

}  // namespace

void affine_quantize_row(const float* w, int64_t cols, int bits, int group_size, DType scale_dtype,
                         uint32_t* codes, void* scales, void* biases) {
  if (bits != 4 && bits != 8) fail("affine quantization: bits must be 4 or 8, got %d", bits);
  if (group_size <= 0 || cols % group_size != 0)
    fail("affine quantization: group size %d does not divide the row length %lld", group_size,
         (long long)cols);
  std::memset(codes, 0, sizeof(uint32_t) * size_t(cols * bits / 32));
  // MLX computes in the weight's dtype: every intermediate is rounded to it.
  switch (scale_dtype) {
    case DType::F32:
      return quantize_groups<DType::F32>(w, cols, bits, group_size, codes, scales, biases);
    case DType::F16:
      return quantize_groups<DType::F16>(w, cols, bits, group_size, codes, scales, biases);
    case DType::BF16:
      return quantize_groups<DType::BF16>(w, cols, bits, group_size, codes, scales, biases);
    default:
      fail("affine quantization: scale dtype %s is not F32, F16 or BF16",
           std::string(dtype_name(scale_dtype)).c_str());
  }
}

void dequantize_row(const WeightMatrix& w, int64_t r, float* dst) {
  if (w.format == WeightFormat::PackedBf16) {
    const auto* p = static_cast<const uint16_t*>(w.data);
    for (int64_t c = 0; c < w.cols; ++c) dst[c] = bf16_to_f32(p[packed_bf16_index(w.cols, r, c)]);
    return;
  }
  if (w.format == WeightFormat::Dense) {
    convert_to_f32(static_cast<const uint8_t*>(w.data) + size_t(r) * w.row_bytes(), w.dtype, w.cols,
                   dst);
    return;
  }
  const int64_t G = w.group_size, groups = w.groups();
  for (int64_t g = 0; g < groups; ++g) {
    const size_t k = affine_scale_index(w, r, g);
    const float s = load_as_f32(w.scales, w.dtype, int64_t(k)),
                b = load_as_f32(w.biases, w.dtype, int64_t(k));
    for (int64_t i = g * G; i < (g + 1) * G; ++i) dst[i] = s * float(affine_code_at(w, r, i)) + b;
  }
}

void check_affine(const WeightMatrix& w, const char* what) {
  if (w.bits != 4 && w.bits != 8)
    fail("%s: %d-bit affine quantization is not supported (4 or 8 bits)", what, w.bits);
  if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
    fail("%s: group size %d is not supported (32, 64 or 128)", what, w.group_size);
  if (w.cols % w.group_size != 0)
    fail("%s: group size %d does not divide the %lld input features", what, w.group_size,
         (long long)w.cols);
  if (w.dtype != DType::F32 && w.dtype != DType::F16 && w.dtype != DType::BF16)
    fail("%s: scales and biases are %s (expected F32, F16 or BF16)", what,
         std::string(dtype_name(w.dtype)).c_str());
}

}  // namespace tandem
