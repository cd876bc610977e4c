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

// Whether affine matrices of `bits` stay packed on the device (codes plus
// f32 scales and biases, read by the packed GEMV and the int8 GEMM) rather
// than dequantized to bf16 at upload. By default 4-bit ones do: measured on
// the H100 (twenty-sixth session) at batch 1 1.06-1.76x the dequantized
// weights' tok/s in 3.2x fewer bytes, as fast at 16 sequences (int8 tensor
// cores), while prefill, which dequantizes bf16 tiles for cuBLAS at every
// step, runs at 0.58-0.77x. 8-bit ones would take bf16 tiles for every
// decode step of more than 8 sequences, so they are dequantized unless
// TANDEM_CUDA_PACKED_QUANT=1 (every affine matrix packed); =0 dequantizes
// every one.
bool keeps_packed(int bits);

// Device bytes upload_matrix(parts) will take.
size_t device_bytes(const std::vector<const WeightMatrix*>& parts);
// The parts' rows one after another (all with the same cols) as one device
// matrix, so projections that read the same input run as one GEMV: bf16
// when every part is bf16 or quantized (dequantized), f32 otherwise (f16
// widened); packed affine codes when allow_packed, keeps_packed and every
// part is affine alike. Adds its bytes to `total`. Throws Error naming a
// CUDA failure or parts of different widths.
DevMatrix upload_matrix(const std::vector<const WeightMatrix*>& parts, size_t& total,
                        bool allow_packed = true);
DevMatrix upload_matrix(const WeightMatrix& w, size_t& total);

}  // namespace tandem::cuda
