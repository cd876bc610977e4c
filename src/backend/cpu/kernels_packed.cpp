// The portable reference of the PackedBf16 kernels (kernels_impl.h): used
// where the AVX-512 path is not in use (a test forcing a narrower ISA) and as
// the tests' second opinion. Plain loops over packed_bf16_index.
#include "backend/cpu/kernels_impl.h"
#include "core/dtype.h"

namespace tandem::cpu::detail {
namespace {

void pack(const uint16_t* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t b0, int64_t b1) {
  for (int64_t r = b0 * 16; r < b1 * 16; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[packed_bf16_index(cols, r, c)] = r < rows ? src[r * cols + c] : uint16_t(0);
}

template <class X>
void matmul(const X* x, int64_t n, const WeightMatrix& w, const float* bias, float* y, int64_t r0,
            int64_t r1) {
  const auto* W = static_cast<const uint16_t*>(w.data);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = r0; r < r1; ++r) {
      float s = bias ? bias[r] : 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) {
        float xv;
        if constexpr (sizeof(X) == 2)
          xv = bf16_to_f32(x[t * w.cols + c]);
        else
          xv = x[t * w.cols + c];
        s += xv * bf16_to_f32(W[packed_bf16_index(w.cols, r, c)]);
      }
      y[t * w.rows + r] = s;
    }
}

void matmul_f32(const float* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                int64_t r0, int64_t r1) {
  matmul(x, n, w, bias, y, r0, r1);
}

void matmul_bf16(const uint16_t* x, int64_t n, const WeightMatrix& w, const float* bias, float* y,
                 int64_t r0, int64_t r1) {
  matmul(x, n, w, bias, y, r0, r1);
}

}  // namespace

const PackedKernels kScalarPackedKernels = {pack, matmul_f32, matmul_bf16};

}  // namespace tandem::cpu::detail
