// Weight matrices on a CUDA device, uploaded once from the host checkpoint:
// shared by the decoder and the vision towers (vision_ops.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace tandem::cuda {

// A weight matrix on the device: bf16 or f32, or affine-quantized (packed
// codes in `buf`, f32 scales and biases).
struct DevMatrix {
  DType dtype = DType::F32;
  DeviceBuffer buf;
  int64_t rows = 0, cols = 0;
  bool affine = false;
  int bits = 0, group = 0;
  DeviceBuffer scales, biases;
  bool empty() const { return rows == 0; }
  size_t bytes() const { return buf.bytes() + scales.bytes() + biases.bytes(); }
  AffineMatrix view() const {
    return AffineMatrix{
        buf.as<uint32_t>(), scales.as<float>(), biases.as<float>(), bits, group, rows, cols};
  }
};

// Device bytes upload_matrix(parts) will take.
size_t device_bytes(const std::vector<const WeightMatrix*>& parts);
// The parts' rows one after another (all with the same cols) as one device
// matrix, so projections that read the same input run as one GEMV: bf16
// when every part is bf16 or quantized (dequantized), f32 otherwise (f16
// widened); packed affine codes when allow_packed, TANDEM_CUDA_PACKED_QUANT=1 and every
// part is affine alike. Adds its bytes to `total`. Throws Error naming a
// CUDA failure or parts of different widths.
DevMatrix upload_matrix(const std::vector<const WeightMatrix*>& parts, size_t& total,
                        bool allow_packed = true);
DevMatrix upload_matrix(const WeightMatrix& w, size_t& total);

}  // namespace tandem::cuda
