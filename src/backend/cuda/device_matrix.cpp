#include "backend/cuda/device_matrix.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/check.h"
#include "core/error.h"
#include "core/quant.h"

namespace tandem::cuda {

namespace {

// Whether parts uploaded together stay quantized on the device: every part
// is affine with the same bits and group size (what the kernels stream) and
// keeps_packed says so for their bits.
bool stays_affine(const std::vector<const WeightMatrix*>& parts) {
  const WeightMatrix* first = nullptr;
  for (const WeightMatrix* w : parts) {
    if (!w->data || w->rows == 0) continue;
    if (w->format != WeightFormat::Affine) return false;
    if (first && (w->bits != first->bits || w->group_size != first->group_size)) return false;
    first = w;
  }
  return first != nullptr && keeps_packed(first->bits);
}

// The device dtype of dense matrices uploaded together: bf16 when every part
// is bf16 or quantized (dequantized: parts of mixed quantization), f32
// otherwise (f16 widened to f32, as the CPU reads it).
DType device_dtype(const std::vector<const WeightMatrix*>& parts) {
  for (const WeightMatrix* w : parts)
    if (w->data && w->rows && !w->quantized() && w->dtype != DType::BF16) return DType::F32;
  return DType::BF16;
}

// Affine parts as one device matrix: their packed rows back to back, scales
// and biases widened to f32.
DevMatrix upload_affine(const std::vector<const WeightMatrix*>& parts, size_t& total) {
  DevMatrix m;
  m.affine = true;
  size_t data_bytes = 0;
  for (const WeightMatrix* w : parts) {
    if (!w->data || w->rows == 0) continue;
    if (m.cols && w->cols != m.cols)
      fail("CUDA decoder: fused projections disagree on their input width (%lld vs %lld)",
           (long long)m.cols, (long long)w->cols);
    check_affine(*w, "CUDA decoder");
    m.cols = w->cols;
    m.rows += w->rows;
    m.bits = w->bits;
    m.group = w->group_size;
    data_bytes += w->row_bytes() * size_t(w->rows);
  }
  m.dtype = DType::F32;
  m.buf = DeviceBuffer(data_bytes);
  const size_t groups = size_t(m.rows * (m.cols / m.group));
  m.scales = DeviceBuffer(groups * 4);
  m.biases = DeviceBuffer(groups * 4);
  uint8_t* dst = m.buf.as<uint8_t>();
  size_t at = 0;
  std::vector<float> sc, bi;
  for (const WeightMatrix* w : parts) {
    if (!w->data || w->rows == 0) continue;
    const size_t bytes = w->row_bytes() * size_t(w->rows);
    CUDA_CHECK(cudaMemcpy(dst, w->data, bytes, cudaMemcpyHostToDevice));
    dst += bytes;
    const int64_t n = w->rows * w->groups();
    sc.resize(size_t(n));
    bi.resize(size_t(n));
    convert_to_f32(w->scales, w->dtype, n, sc.data());
    convert_to_f32(w->biases, w->dtype, n, bi.data());
    CUDA_CHECK(
        cudaMemcpy(m.scales.as<float>() + at, sc.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(
        cudaMemcpy(m.biases.as<float>() + at, bi.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
    at += size_t(n);
  }
  total += m.bytes();
  return m;
}

}  // namespace

bool keeps_packed(int bits) {
  if (env_is("TANDEM_CUDA_PACKED_QUANT", "0")) return false;
  return bits == 4 || env_is("TANDEM_CUDA_PACKED_QUANT", "1");
}

size_t device_bytes(const std::vector<const WeightMatrix*>& parts) {
  size_t n = 0;
  if (stays_affine(parts)) {
    for (const WeightMatrix* w : parts)
      if (w->data) n += w->row_bytes() * size_t(w->rows) + 2 * size_t(w->rows * w->groups()) * 4;
    return n;
  }
  for (const WeightMatrix* w : parts)
    if (w->data) n += size_t(w->rows * w->cols);
  return n * dtype_size(device_dtype(parts));
}

// The parts' rows one after another (all with the same cols) as one device
// matrix, so projections that read the same input run as one GEMV. Rows are
// converted a chunk at a time when the stored type is not the device type.
DevMatrix upload_matrix(const std::vector<const WeightMatrix*>& parts, size_t& total,
                        bool allow_packed) {
  if (allow_packed && stays_affine(parts)) return upload_affine(parts, total);
  DevMatrix m;
  for (const WeightMatrix* w : parts) {
    if (!w->data || w->rows == 0) continue;
    if (m.cols && w->cols != m.cols)
      fail("CUDA decoder: fused projections disagree on their input width (%lld vs %lld)",
           (long long)m.cols, (long long)w->cols);
    m.cols = w->cols;
    m.rows += w->rows;
  }
  if (m.rows == 0) return m;
  m.dtype = device_dtype(parts);
  const size_t elem = dtype_size(m.dtype);
  m.buf = DeviceBuffer(size_t(m.rows * m.cols) * elem);
  uint8_t* dst = m.buf.as<uint8_t>();
  std::vector<float> row(size_t(m.cols));
  std::vector<uint8_t> part;
  for (const WeightMatrix* w : parts) {
    if (!w->data || w->rows == 0) continue;
    const size_t row_bytes = size_t(w->cols) * elem;
    if (w->format == WeightFormat::Dense && w->dtype == m.dtype) {
      CUDA_CHECK(cudaMemcpy(dst, w->data, size_t(w->rows) * row_bytes, cudaMemcpyHostToDevice));
      dst += size_t(w->rows) * row_bytes;
      continue;
    }
    const int64_t chunk = std::max<int64_t>(1, (int64_t(16) << 20) / int64_t(row_bytes));
    for (int64_t r0 = 0; r0 < w->rows; r0 += chunk) {
      const int64_t rows = std::min(chunk, w->rows - r0);
      part.resize(size_t(rows) * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        if (w->format != WeightFormat::Dense)  // quantized, or packed for the CPU
          dequantize_row(*w, r0 + r, row.data());
        else
          convert_to_f32(static_cast<const uint8_t*>(w->data) +
                             size_t(r0 + r) * size_t(w->cols) * dtype_size(w->dtype),
                         w->dtype, w->cols, row.data());
        for (int64_t c = 0; c < w->cols; ++c) {
          if (m.dtype == DType::BF16)
            reinterpret_cast<uint16_t*>(part.data())[r * w->cols + c] =
                tandem::f32_to_bf16(row[size_t(c)]);
          else
            reinterpret_cast<float*>(part.data())[r * w->cols + c] = row[size_t(c)];
        }
      }
      CUDA_CHECK(cudaMemcpy(dst, part.data(), part.size(), cudaMemcpyHostToDevice));
      dst += part.size();
    }
  }
  total += m.buf.bytes();
  return m;
}

DevMatrix upload_matrix(const WeightMatrix& w, size_t& total) {
  return upload_matrix(std::vector<const WeightMatrix*>{&w}, total);
}
}  // namespace tandem::cuda
