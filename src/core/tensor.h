// Non-owning views of tensors. Weights are views into mmapped checkpoint
// files (or into buffers the model owns after a conversion); the view never
// frees anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"

struct TensorView {
  DType dtype = DType::F32;
  Shape shape;                 // row-major, outermost first
  const void* data = nullptr;  // numel * dtype_size(dtype) bytes

  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
};

// How a WeightMatrix stores its values. Every kernel entry point dispatches on
// it, so a model never knows whether its weights are dense or quantized.
enum class WeightFormat : uint8_t {
  Dense,         // rows x cols elements of `dtype` (F32, F16 or BF16), row-major
  Affine,        // MLX affine quantization ("mode": "affine"): unsigned `bits`-bit codes
                 // (4 or 8) packed little-end first into uint32 words, [rows, cols·bits/32];
                 // per group of `group_size` consecutive values of a row a scale and a bias
                 // in `dtype` ([rows, cols/group_size] each): w = scale · q + bias.
  PackedBf16,    // BF16 in blocks of 16 rows, for the CPU's outer-product kernels
                 // (kernels_packed_avx512.cpp): the rows are padded with zeros to a
                 // multiple of 16 and cols is even; element (r, c) is at
                 // ((r / 16) · cols + (c & ~1)) · 16 + (r % 16) · 2 + (c & 1), so one
                 // 64-byte vector holds a column pair of 16 consecutive rows.
                 // Made at load by pack_bf16_rows16 (backend/cpu/kernels.h).
  PackedAffine,  // Affine codes regrouped in blocks of 16 rows for the CPU's int8
                 // outer-product kernels (kernels_qpacked_avx512vnni.cpp); rows padded
                 // with zero codes (and zero scales and biases) to a multiple of 16. Block
                 // p's codes are 64-byte vectors: vector j holds 4 bytes of each of the 16
                 // rows (row i at byte 4i) for the columns [jV, (j+1)V), V = 32 / bits. At
                 // 8 bits byte b is column jV + b; at 4 bits its low nibble is column
                 // jV + b and its high nibble column jV + b + 4. Scales and biases (dtype)
                 // of row 16p + i, group g at [(p · groups + g) · 16 + i].
                 // Made at load by pack_affine_rows16 (backend/cpu/kernels.h).
  // Further kinds (GGUF Q4_0, Q8_0, Q4_K, Q6_K: self-contained blocks along each
  // row at `data`, no separate scales) join here.
};

// A weight matrix used by matmul: [rows = out features, cols = in features],
// each row contiguous, as PyTorch's nn.Linear stores it.
struct WeightMatrix {
  DType dtype = DType::F32;  // Dense: the element type; Affine: the type of scales and biases
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  WeightFormat format = WeightFormat::Dense;
  int32_t bits = 0;              // Affine, PackedAffine: 4 or 8
  int32_t group_size = 0;        // Affine, PackedAffine: 32, 64 or 128; divides cols
  const void* scales = nullptr;  // Affine: [rows, cols / group_size] of dtype
  const void* biases = nullptr;  // Affine: [rows, cols / group_size] of dtype

  // Affine codes, in MLX's row layout or packed for the CPU.
  bool quantized() const {
    return format == WeightFormat::Affine || format == WeightFormat::PackedAffine;
  }
  // Rows as stored: the packed formats pad them to a multiple of 16.
  int64_t stored_rows() const {
    return format == WeightFormat::PackedBf16 || format == WeightFormat::PackedAffine
               ? (rows + 15) / 16 * 16
               : rows;
  }
  int64_t groups() const { return group_size > 0 ? cols / group_size : 0; }  // per row
  // Bytes of `data` per stored row.
  size_t row_bytes() const {
    return quantized() ? size_t(cols) * size_t(bits) / 8 : size_t(cols) * dtype_size(dtype);
  }
  // Bytes one full pass reads: data, plus scales and biases.
  size_t nbytes() const {
    size_t n = row_bytes() * size_t(stored_rows());
    if (quantized()) n += 2 * size_t(stored_rows() * groups()) * dtype_size(dtype);
    return n;
  }
};

// Index of element (r, c) in a PackedBf16 matrix of `cols` columns.
inline size_t packed_bf16_index(int64_t cols, int64_t r, int64_t c) {
  return size_t(((r / 16) * cols + (c & ~int64_t(1))) * 16 + (r % 16) * 2 + (c & 1));
}

// Byte offset of code (r, c) in a PackedAffine matrix of `cols` columns
// and `bits` bits; *shift: the code's first bit within that byte.
inline size_t packed_affine_byte(int64_t cols, int bits, int64_t r, int64_t c, int* shift) {
  const int64_t per_dword = 32 / bits, in = c % per_dword;
  *shift = int(in / 4) * 4;  // 4 bits: columns 4-7 of a dword in the high nibbles
  return size_t((r / 16) * 16 * (cols * bits / 8) + (c / per_dword) * 64 + (r % 16) * 4 + in % 4);
}
// Index of the scale (and bias) of row r, group g in a PackedAffine matrix
// of `groups` groups a row.
inline size_t packed_affine_scale_index(int64_t groups, int64_t r, int64_t g) {
  return size_t(((r / 16) * groups + g) * 16 + r % 16);
}

// Reads element i of a F32/F16/BF16 view as float.
float load_as_f32(const void* data, DType dtype, int64_t i);
// Converts n elements of a F32/F16/BF16 buffer into f32.
void convert_to_f32(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace tandem
