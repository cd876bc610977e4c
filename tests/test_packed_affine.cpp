// Affine weights packed for the CPU's int8 outer-product kernels
// (WeightFormat::PackedAffine): the packing keeps every code, scale and
// bias and zeroes the padding rows, and matmul over the packed matrix equals
// matmul over MLX's layout on every ISA path (the same int8 activations and
// integer sums; only the order of the f32 additions differs), for shapes
// around every tile edge (16-row blocks, 4 far-apart decode streams, 8-, 4-,
// 2- and 1-token tiles, the thread split) and every bits / group / scale type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "test_util.h"

using namespace tandem;
using tandem::test::random_floats;

namespace {

// An MLX affine matrix (codes, scales, biases) and its packed copy.
struct Quantized {
  WeightMatrix affine;
  std::vector<uint32_t> codes;
  std::vector<uint8_t> scales, biases;
  std::vector<uint8_t> packed;  // codes, scales, biases as packed_affine_view lays them out

  WeightMatrix view() const {
    return cpu::packed_affine_view(affine, const_cast<uint8_t*>(packed.data()));
  }
};

Quantized make_quantized(int64_t rows, int64_t cols, int bits, int group, DType dtype,
                         std::mt19937& rng) {
  Quantized q;
  const int64_t groups = cols / group;
  const size_t sb = dtype_size(dtype);
  q.codes.assign(size_t(rows * cols * bits / 32), 0);
  q.scales.assign(size_t(rows * groups) * sb, 0);
  q.biases.assign(size_t(rows * groups) * sb, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> w = random_floats(size_t(cols), rng);
    affine_quantize_row(w.data(), cols, bits, group, dtype, q.codes.data() + r * cols * bits / 32,
                        q.scales.data() + size_t(r * groups) * sb,
                        q.biases.data() + size_t(r * groups) * sb);
  }
  q.affine.format = WeightFormat::Affine;
  q.affine.dtype = dtype;
  q.affine.rows = rows;
  q.affine.cols = cols;
  q.affine.bits = bits;
  q.affine.group_size = group;
  q.affine.data = q.codes.data();
  q.affine.scales = q.scales.data();
  q.affine.biases = q.biases.data();
  const WeightMatrix layout = cpu::packed_affine_view(q.affine, nullptr);
  q.packed.assign(layout.nbytes(), 0xAB);  // a byte left unwritten shows
  const WeightMatrix p = q.view();
  const int64_t blocks = p.stored_rows() / 16;
  // In two calls, as the loader's threads split the blocks.
  cpu::pack_affine_rows16(q.affine, p, 0, blocks / 2);
  cpu::pack_affine_rows16(q.affine, p, blocks / 2, blocks);
  return q;
}

struct IsaReset {
  ~IsaReset() {
    cpu::set_isa_for_testing("");
    cpu::set_vnni_for_testing(true);
  }
};

TEST(PackedAffine, PackingKeepsEveryCodeScaleAndBias) {
  std::mt19937 rng(43);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128})
      for (DType dtype : {DType::BF16, DType::F16, DType::F32})
        for (int64_t rows : {1, 15, 16, 17, 50}) {
          const int64_t cols = 2 * group + (group == 32 ? 32 : 0);
          const Quantized q = make_quantized(rows, cols, bits, group, dtype, rng);
          const WeightMatrix p = q.view();
          const std::string what = std::to_string(bits) + "-bit g" + std::to_string(group) + " " +
                                   std::string(dtype_name(dtype)) + " " + std::to_string(rows) +
                                   "x" + std::to_string(cols);
          ASSERT_EQ(p.format, WeightFormat::PackedAffine);
          ASSERT_EQ(p.stored_rows(), (rows + 15) / 16 * 16) << what;
          ASSERT_EQ(p.nbytes(), size_t(p.stored_rows()) * size_t(cols * bits / 8) +
                                    2 * size_t(p.stored_rows() * p.groups()) * dtype_size(dtype))
              << what;
          std::vector<float> want(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
          for (int64_t r = 0; r < p.stored_rows(); ++r) {
            for (int64_t c = 0; c < cols; ++c) {
              const uint32_t code = r < rows ? affine_code_at(q.affine, r, c) : 0u;
              ASSERT_EQ(affine_code_at(p, r, c), code) << what << " (" << r << ", " << c << ")";
            }
            for (int64_t g = 0; g < p.groups(); ++g) {
              const size_t sb = dtype_size(dtype), at = affine_scale_index(p, r, g) * sb;
              const auto* ps = static_cast<const uint8_t*>(p.scales) + at;
              const auto* pb = static_cast<const uint8_t*>(p.biases) + at;
              for (size_t k = 0; k < sb; ++k) {
                ASSERT_EQ(ps[k], r < rows ? q.scales[size_t(r * p.groups() + g) * sb + k] : 0)
                    << what << " scale (" << r << ", " << g << ")";
                ASSERT_EQ(pb[k], r < rows ? q.biases[size_t(r * p.groups() + g) * sb + k] : 0)
                    << what << " bias (" << r << ", " << g << ")";
              }
            }
            if (r >= rows) continue;
            dequantize_row(q.affine, r, want.data());
            dequantize_row(p, r, got.data());
            ASSERT_EQ(got, want) << what << " row " << r;
          }
        }
}

TEST(PackedAffine, PackingRejectsWhatItCannotPack) {
  std::vector<float> dense(16 * 32);
  EXPECT_THROW(cpu::packed_affine_view(WeightMatrix{DType::F32, dense.data(), 16, 32}, nullptr),
               std::exception);
  std::mt19937 rng(3);
  Quantized q = make_quantized(16, 64, 4, 32, DType::BF16, rng);
  q.affine.bits = 2;
  EXPECT_THROW(cpu::packed_affine_view(q.affine, nullptr), std::exception);
}

// y over the packed matrix against y over MLX's layout on the same ISA path,
// within 1e-5 of Σ|x·w| + |bias| (the same integer sums, scaled and added
// in another order).
void expect_same_product(ThreadPool& pool, const Quantized& q, const std::vector<float>& x,
                         int64_t n, const float* bias, const std::string& what) {
  const int64_t rows = q.affine.rows, cols = q.affine.cols;
  std::vector<float> want(size_t(n * rows), NAN), got(size_t(n * rows), NAN);
  cpu::matmul(pool, x.data(), n, q.affine, bias, want.data());
  cpu::matmul(pool, x.data(), n, q.view(), bias, got.data());
  std::vector<float> w(static_cast<size_t>(cols));
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(q.affine, r, w.data());
    for (int64_t t = 0; t < n; ++t) {
      double mag = bias ? std::fabs(bias[r]) : 0.0;
      for (int64_t c = 0; c < cols; ++c) mag += std::fabs(double(x[size_t(t * cols + c)]) * w[c]);
      const float a = want[size_t(t * rows + r)], b = got[size_t(t * rows + r)];
      if (!(std::fabs(a - b) <= 1e-5 * mag) && failures++ < 5)
        ADD_FAILURE() << what << ": y[" << t << ", " << r << "] = " << b << " packed, " << a
                      << " in MLX's layout";
    }
  }
}

TEST(PackedAffine, MatmulEqualsTheMlxLayoutOnEveryPath) {
  IsaReset reset;
  std::mt19937 rng(47);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (int bits : {4, 8})
      for (int64_t rows : {1, 16, 17, 50, 130, 290})
        for (int64_t cols : {64, 256, 2048}) {
          const int group = cols == 256 ? 128 : cols == 64 ? 32 : 64;
          const DType dtype = rows % 3 == 0 ? DType::F32 : rows % 2 ? DType::BF16 : DType::F16;
          const Quantized q = make_quantized(rows, cols, bits, group, dtype, rng);
          const std::vector<float> bias = random_floats(size_t(rows), rng);
          for (int64_t n : {1, 2, 3, 7, 8, 9, 15, 25}) {
            if (rows * cols * n > 2'000'000) continue;  // the scalar reference's time
            const std::vector<float> x = random_floats(size_t(n * cols), rng);
            for (const std::string& isa : test::supported_isas())
              for (bool vnni : {true, false}) {
                if (!vnni && isa == "scalar") continue;
                ASSERT_TRUE(cpu::set_isa_for_testing(isa));
                cpu::set_vnni_for_testing(vnni);
                const bool with_bias = (n + rows) % 2 == 0;
                expect_same_product(pool, q, x, n, with_bias ? bias.data() : nullptr,
                                    isa + (vnni ? "" : " (no VNNI)") + " " + std::to_string(bits) +
                                        "-bit " + std::to_string(rows) + "x" +
                                        std::to_string(cols) + " n=" + std::to_string(n) +
                                        " threads=" + std::to_string(threads));
                if (::testing::Test::HasFailure()) return;
              }
          }
        }
  }
}

TEST(PackedAffine, MatmulDoesNotReadPastThePackedCodes) {
  // The packed codes end exactly at an inaccessible page: the kernels' 16-row
  // blocks, decode streams and token tiles must stay inside them.
  std::mt19937 rng(53);
  ThreadPool pool(2);
  for (int bits : {4, 8})
    for (int64_t rows : {16, 33, 96})
      for (int64_t cols : {32, 1024}) {
        const Quantized q = make_quantized(rows, cols, bits, 32, DType::BF16, rng);
        WeightMatrix view = q.view();
        const test::GuardedCopy guarded(view.data, view.row_bytes() * size_t(view.stored_rows()));
        view.data = guarded.data();
        for (int64_t n : {1, 9, 40}) {
          const std::vector<float> x = random_floats(size_t(n * cols), rng);
          std::vector<float> want(size_t(n * rows)), got(size_t(n * rows), NAN);
          cpu::matmul(pool, x.data(), n, q.view(), nullptr, want.data());
          cpu::matmul(pool, x.data(), n, view, nullptr, got.data());
          EXPECT_EQ(got, want) << "guarded " << bits << "-bit " << rows << "x" << cols
                               << " n=" << n;
        }
      }
}

}  // namespace
