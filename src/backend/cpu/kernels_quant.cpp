// Quantized matmul: the multithreaded driver and the portable scalar
// reference (see kernels_quant.h for the method every ISA implements).
#include "backend/cpu/kernels_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"

namespace tandem::cpu::detail {

namespace {

constexpr size_t align64(size_t n) {
  return (n + 63) & ~size_t(63);
}

}  // namespace

QuantActLayout quant_act_layout(const WeightMatrix& w) {
  QuantActLayout l;
  l.d = int64_t(align64(size_t(w.cols)));
  l.xs = l.d + int64_t(align64(sizeof(float) * size_t(w.cols / 32)));
  l.total = l.xs + int64_t(align64(sizeof(float) * size_t(w.groups())));
  return l;
}

namespace {

// ---- Scalar reference --------------------------------------------------------
// Prepared row: quant_act_layout's (kernels_quant.h).

size_t scalar_act_bytes(const WeightMatrix& w) {
  return size_t(quant_act_layout(w).total);
}

void scalar_prepare(const float* x, const WeightMatrix& w, uint8_t* out) {
  const int64_t cols = w.cols, G = w.group_size;
  const QuantActLayout L = quant_act_layout(w);
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* d = reinterpret_cast<float*>(out + L.d);
  auto* xs = reinterpret_cast<float*>(out + L.xs);
  for (int64_t g = 0; g < w.groups(); ++g) xs[g] = 0.0f;
  for (int64_t b = 0; b < cols / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      q[b * 32 + i] = int8_t(std::nearbyint(x[b * 32 + i] * id));
      sum += q[b * 32 + i];
    }
    xs[b * 32 / G] += float(sum) * d[b];
  }
}

// Over Affine and PackedAffine weights alike (codes and scales found by
// affine_code_at / affine_scale_index): the packed kernels' reference.
void scalar_compute(const uint8_t* acts, int64_t n, const WeightMatrix& w, const float* bias,
                    float* y, int64_t r0, int64_t r1) {
  const int64_t cols = w.cols, groups = w.groups(), G = w.group_size;
  const QuantActLayout L = quant_act_layout(w);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t t = 0; t < n; ++t) {
      const uint8_t* a = acts + t * L.total;
      const auto* q = reinterpret_cast<const int8_t*>(a);
      const auto* d = reinterpret_cast<const float*>(a + L.d);
      const auto* xs = reinterpret_cast<const float*>(a + L.xs);
      float acc = 0.0f;
      for (int64_t b = 0; b < cols / 32; ++b) {
        int32_t isum = 0;
        for (int64_t i = b * 32; i < b * 32 + 32; ++i)
          isum += int32_t(affine_code_at(w, r, i)) * int32_t(q[i]);
        const float s =
            load_as_f32(w.scales, w.dtype, int64_t(affine_scale_index(w, r, b * 32 / G)));
        acc += float(isum) * (s * d[b]);
      }
      float bsum = 0.0f;
      for (int64_t g = 0; g < groups; ++g)
        bsum += load_as_f32(w.biases, w.dtype, int64_t(affine_scale_index(w, r, g))) * xs[g];
      y[t * w.rows + r] = acc + bsum + (bias ? bias[r] : 0.0f);
    }
  }
}

// One 64-byte aligned scratch buffer per calling thread, reused across calls.
uint8_t* act_buffer(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - (p & 63)) & 63);
}

// Below this many multiply-adds a chunk is not worth a dispatch (~1-2 us).
constexpr int64_t kMinChunkMacs = 64 * 1024;
// Output rows per scheduling unit (64-byte lines of y).
constexpr int64_t kRowGroup = 16;
// Activation rows per scheduling unit when the split is over activations.
constexpr int64_t kTokenGroup = 8;

// MLX word j of a 4-bit row (columns 8j .. 8j + 7, lowest bits first) as
// PackedAffine's dword: byte b holds column 8j + b low, 8j + b + 4 high.
uint32_t interleave_nibbles(uint32_t word) {
  uint32_t out = 0;
  for (int b = 0; b < 4; ++b)
    out |= (((word >> (4 * b)) & 0xFu) | ((word >> (4 * b + 16)) & 0xFu) << 4) << (8 * b);
  return out;
}

}  // namespace

void pack_affine_blocks(const WeightMatrix& src, const WeightMatrix& dst, int64_t b0, int64_t b1) {
  const int64_t words = src.cols * src.bits / 32, groups = src.groups();
  const size_t rb = src.row_bytes(), sb = dtype_size(src.dtype);
  auto* codes = static_cast<uint8_t*>(const_cast<void*>(dst.data));
  auto* scales = static_cast<uint8_t*>(const_cast<void*>(dst.scales));
  auto* biases = static_cast<uint8_t*>(const_cast<void*>(dst.biases));
  for (int64_t b = b0; b < b1; ++b) {
    // Vector j of block b: dword j · 16 + i is row 16b + i's word j.
    auto* block = reinterpret_cast<uint32_t*>(codes + size_t(b) * 16 * rb);
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t r = 16 * b + i;
      const size_t at = size_t(b * groups) * 16 + size_t(i);  // group 0's scale
      if (r >= src.rows) {  // padding: zero codes, scales and biases
        for (int64_t j = 0; j < words; ++j) block[j * 16 + i] = 0;
        for (int64_t g = 0; g < groups; ++g) {
          std::memset(scales + (at + size_t(g) * 16) * sb, 0, sb);
          std::memset(biases + (at + size_t(g) * 16) * sb, 0, sb);
        }
        continue;
      }
      const auto* row =
          reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(src.data) + size_t(r) * rb);
      for (int64_t j = 0; j < words; ++j)
        block[j * 16 + i] = src.bits == 8 ? row[j] : interleave_nibbles(row[j]);
      const auto* sc = static_cast<const uint8_t*>(src.scales) + size_t(r * groups) * sb;
      const auto* bi = static_cast<const uint8_t*>(src.biases) + size_t(r * groups) * sb;
      for (int64_t g = 0; g < groups; ++g) {
        std::memcpy(scales + (at + size_t(g) * 16) * sb, sc + size_t(g) * sb, sb);
        std::memcpy(biases + (at + size_t(g) * 16) * sb, bi + size_t(g) * sb, sb);
      }
    }
  }
}

const QuantKernels kScalarQuant = {"scalar", scalar_act_bytes, scalar_prepare, scalar_compute};

void quant_matmul(ThreadPool& pool, const QuantKernels& k, const float* x, int64_t n,
                  const WeightMatrix& w, const float* bias, float* y) {
  if (n <= 0 || w.rows <= 0) return;
  const size_t ab = k.act_bytes(w);
  uint8_t* acts = act_buffer(ab * size_t(n));
  const int64_t rows = w.rows, cols = std::max<int64_t>(w.cols, 1);
  if (n * cols < 4 * kMinChunkMacs / 64) {
    for (int64_t t = 0; t < n; ++t) k.prepare(x + t * w.cols, w, acts + size_t(t) * ab);
  } else {
    pool.parallel_for(n, std::max<int64_t>(1, 16384 / cols), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) k.prepare(x + t * w.cols, w, acts + size_t(t) * ab);
    });
  }
  const int64_t row_groups = (rows + kRowGroup - 1) / kRowGroup;
  if (n == 1 || row_groups >= 2 * int64_t(pool.size())) {
    // Split over output rows: W is read once in total.
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / (kRowGroup * cols * n));
    pool.parallel_for(row_groups, grain, [&](int64_t b, int64_t e) {
      k.compute(acts, n, w, bias, y, b * kRowGroup, std::min(e * kRowGroup, rows));
    });
  } else {
    // Few output rows, many activation rows: split over activation rows.
    const int64_t groups = (n + kTokenGroup - 1) / kTokenGroup;
    const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / (kTokenGroup * cols * rows));
    pool.parallel_for(groups, grain, [&](int64_t b, int64_t e) {
      const int64_t t0 = b * kTokenGroup, t1 = std::min(e * kTokenGroup, n);
      k.compute(acts + size_t(t0) * ab, t1 - t0, w, bias, y + t0 * rows, 0, rows);
    });
  }
}

}  // namespace tandem::cpu::detail
