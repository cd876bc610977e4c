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

// A weight matrix used by matmul: row-major [rows = out features, cols = in
// features], each row contiguous, as PyTorch's nn.Linear stores it.
struct WeightMatrix {
  DType dtype = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  size_t nbytes() const { return size_t(rows * cols) * dtype_size(dtype); }
};

// Reads element i of a F32/F16/BF16 view as float.
float load_as_f32(const void* data, DType dtype, int64_t i);
// Converts n elements of a F32/F16/BF16 buffer into f32.
void convert_to_f32(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace tandem
