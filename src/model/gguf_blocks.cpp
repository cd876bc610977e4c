#include "model/gguf_blocks.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

uint16_t read_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float f16_at(const uint8_t* p) {
  return f16_to_f32(read_u16(p));
}

void q8_0_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) y[i] = d * float(int8_t(b[2 + i]));
}

void q4_0_block(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(b[2 + j] & 0xF) - 8);
    y[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}

// Scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes.
void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The per-sub-block multipliers of a Q4_K block: w = a[j]·q − c[j].
void q4_k_factors(const uint8_t* b, float a[8], float c[8]) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    a[j] = d * float(sc);
    c[j] = dmin * float(m);
  }
}

// Nibble of value i (0..255) of a Q4_K block.
int q4_k_nibble(const uint8_t* b, int i) {
  const uint8_t* qs = b + 16;
  const int chunk = i / 64, k = i % 64;
  const uint8_t byte = qs[chunk * 32 + (k % 32)];
  return k < 32 ? (byte & 0xF) : (byte >> 4);
}

void q4_k_block(const uint8_t* b, float* y) {
  float a[8], c[8];
  q4_k_factors(b, a, c);
  for (int i = 0; i < 256; ++i) y[i] = a[i / 32] * float(q4_k_nibble(b, i)) - c[i / 32];
}

void q6_k_block(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int n = 0; n < 2; ++n) {  // two halves of 128 values
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[is + 0]) * float(q1);
      y[l + 32] = d * float(sc[is + 2]) * float(q2);
      y[l + 64] = d * float(sc[is + 4]) * float(q3);
      y[l + 96] = d * float(sc[is + 6]) * float(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

uint8_t* allocate(size_t bytes, OwnedBuffers& owned, uint64_t& owned_bytes) {
  owned.push_back(allocate_owned(bytes));
  owned_bytes += bytes;
  return owned.back().get();
}

void put_scale(void* dst, DType t, int64_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(dst)[i] = v;
  else
    static_cast<uint16_t*>(dst)[i] = f32_to_f16(v);
}

}  // namespace

void gguf_dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst) {
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(read_u16(src + 2 * i));
      return;
    default: break;
  }
  const int64_t bv = ggml_block_values(t), bb = ggml_block_bytes(t);
  for (int64_t blk = 0; blk < n / bv; ++blk) {
    const uint8_t* b = src + blk * bb;
    float* y = dst + blk * bv;
    switch (t) {
      case GgmlType::Q8_0: q8_0_block(b, y); break;
      case GgmlType::Q4_0: q4_0_block(b, y); break;
      case GgmlType::Q4_K: q4_k_block(b, y); break;
      case GgmlType::Q6_K: q6_k_block(b, y); break;
      default: break;
    }
  }
}

bool gguf_affine_lossless(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_K;
}

WeightMatrix gguf_to_affine(GgmlType t, const uint8_t* src, int64_t rows, int64_t cols,
                            OwnedBuffers& owned, uint64_t& owned_bytes) {
  if (!gguf_affine_lossless(t))
    fail("gguf_to_affine: %s has no lossless affine form", ggml_type_name(t));
  const int bits = t == GgmlType::Q8_0 ? 8 : 4;
  const int64_t bv = ggml_block_values(t), bb = ggml_block_bytes(t);
  const int64_t groups = rows * (cols / 32);
  const int64_t blocks_per_row = cols / bv;

  DType scale_dtype = DType::F32;
  if (t != GgmlType::Q4_K) {  // F16 scales when every bias is finite in f16
    const float factor = t == GgmlType::Q8_0 ? 128.0f : 8.0f;
    scale_dtype = DType::F16;
    for (int64_t g = 0; g < groups && scale_dtype == DType::F16; ++g)
      if (!(std::fabs(f16_at(src + g * bb)) * factor <= 65504.0f)) scale_dtype = DType::F32;
  }

  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = scale_dtype;
  w.rows = rows;
  w.cols = cols;
  w.bits = bits;
  w.group_size = 32;
  auto* codes = allocate(size_t(rows) * w.row_bytes(), owned, owned_bytes);
  void* scales = allocate(size_t(groups) * dtype_size(scale_dtype), owned, owned_bytes);
  void* biases = allocate(size_t(groups) * dtype_size(scale_dtype), owned, owned_bytes);
  std::memset(codes, 0, size_t(rows) * w.row_bytes());

  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row_codes = codes + size_t(r) * w.row_bytes();
    for (int64_t blk = 0; blk < blocks_per_row; ++blk) {
      const uint8_t* b = src + (r * blocks_per_row + blk) * bb;
      const int64_t first = blk * bv;  // first value of the block in the row
      const int64_t g0 = r * (cols / 32) + first / 32;
      if (t == GgmlType::Q8_0) {
        const float d = f16_at(b);
        put_scale(scales, scale_dtype, g0, d);
        put_scale(biases, scale_dtype, g0, -128.0f * d);
        for (int i = 0; i < 32; ++i) row_codes[first + i] = uint8_t(int(int8_t(b[2 + i])) + 128);
      } else if (t == GgmlType::Q4_0) {
        const float d = f16_at(b);
        put_scale(scales, scale_dtype, g0, d);
        put_scale(biases, scale_dtype, g0, -8.0f * d);
        for (int j = 0; j < 16; ++j) {
          const int lo = b[2 + j] & 0xF, hi = b[2 + j] >> 4;
          const int64_t i0 = first + j, i1 = first + j + 16;
          row_codes[i0 / 2] |= uint8_t(lo << (4 * (i0 % 2)));
          row_codes[i1 / 2] |= uint8_t(hi << (4 * (i1 % 2)));
        }
      } else {  // Q4_K
        float a[8], c[8];
        q4_k_factors(b, a, c);
        for (int j = 0; j < 8; ++j) {
          put_scale(scales, scale_dtype, g0 + j, a[j]);
          put_scale(biases, scale_dtype, g0 + j, -c[j]);
        }
        for (int i = 0; i < 256; ++i) {
          const int64_t k = first + i;
          row_codes[k / 2] |= uint8_t(q4_k_nibble(b, i) << (4 * (k % 2)));
        }
      }
    }
  }
  w.data = codes;
  w.scales = scales;
  w.biases = biases;
  return w;
}

WeightMatrix gguf_q6k_to_affine(const uint8_t* src, int64_t rows, int64_t cols, OwnedBuffers& owned,
                                uint64_t& owned_bytes) {
  constexpr int64_t kBlock = 256, kBlockBytes = 210;
  if (cols % kBlock != 0)
    fail("gguf_q6k_to_affine: %lld columns are not whole Q6_K blocks", (long long)cols);
  WeightMatrix w;
  w.format = WeightFormat::Affine;
  w.dtype = DType::F32;
  w.rows = rows;
  w.cols = cols;
  w.bits = 8;
  w.group_size = 32;
  const int64_t groups = rows * (cols / 32);
  auto* codes = allocate(size_t(rows * cols), owned, owned_bytes);
  auto* scales = reinterpret_cast<float*>(allocate(size_t(groups) * 4, owned, owned_bytes));
  auto* biases = reinterpret_cast<float*>(allocate(size_t(groups) * 4, owned, owned_bytes));
  std::vector<float> v(kBlock);
  for (int64_t blk = 0; blk < rows * (cols / kBlock); ++blk) {
    const uint8_t* b = src + blk * kBlockBytes;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16_at(b + 208);
    q6_k_block(b, v.data());
    for (int g = 0; g < kBlock / 32; ++g) {
      const int64_t at = blk * (kBlock / 32) + g;  // the group's index in the matrix
      const float* x = v.data() + 32 * g;
      uint8_t* c = codes + at * 32;
      const float m =
          std::max(std::fabs(d * float(sc[2 * g])), std::fabs(d * float(sc[2 * g + 1])));
      const float step = m / 4.0f;
      if (!(step > 0.0f)) {  // both sub-blocks scaled by 0 (or d is not finite)
        scales[at] = step;
        biases[at] = 0.0f;
        std::memset(c, 0, 32);
        continue;
      }
      int q[32], lo = INT32_MAX, hi = INT32_MIN;
      for (int i = 0; i < 32; ++i) {
        q[i] = int(std::lrint(x[i] / step));
        lo = std::min(lo, q[i]);
        hi = std::max(hi, q[i]);
      }
      if (hi - lo <= 255) {
        scales[at] = step;
        biases[at] = float(lo) * step;
        for (int i = 0; i < 32; ++i) c[i] = uint8_t(q[i] - lo);
      } else {  // codes from -128 to 128: the group's min/max grid instead
        const auto [mn, mx] = std::minmax_element(x, x + 32);
        const float s = (*mx - *mn) / 255.0f;
        scales[at] = s;
        biases[at] = *mn;
        for (int i = 0; i < 32; ++i)
          c[i] = uint8_t(std::clamp(std::lrint((x[i] - *mn) / s), 0L, 255L));
      }
    }
  }
  w.data = codes;
  w.scales = scales;
  w.biases = biases;
  return w;
}

}  // namespace tandem
