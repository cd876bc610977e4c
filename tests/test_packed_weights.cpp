// Weights packed for the CPU's outer-product kernels (WeightFormat::PackedBf16):
// the packing keeps every value, and matmul over them is the product with the
// dense matrix on every ISA path, with f32 and bf16 inputs, for shapes around
// every tile edge (16-row vectors, 2- and 3-vector panels, 8-token tiles, the
// 1,024-value k blocks, the 96-row thread split).
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

// A dense BF16 matrix and its packed copy.
struct Packed {
  int64_t rows, cols;
  std::vector<uint16_t> dense;
  std::vector<uint16_t> packed;

  WeightMatrix dense_view() const { return WeightMatrix{DType::BF16, dense.data(), rows, cols}; }
  WeightMatrix view() const { return cpu::packed_bf16_view(dense_view(), packed.data()); }
};

Packed make_packed(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Packed p{rows, cols, {}, {}};
  p.dense.resize(size_t(rows * cols));
  for (uint16_t& v : p.dense) v = f32_to_bf16(dist(rng));
  const WeightMatrix view = cpu::packed_bf16_view(p.dense_view(), nullptr);
  p.packed.assign(view.nbytes() / 2, 0xffff);  // NaN bits: a block left unwritten shows
  const int64_t blocks = view.stored_rows() / 16;
  // In two calls, as the loader's threads split the blocks.
  cpu::pack_bf16_rows16(p.dense_view(), p.packed.data(), 0, blocks / 2);
  cpu::pack_bf16_rows16(p.dense_view(), p.packed.data(), blocks / 2, blocks);
  return p;
}

struct IsaReset {
  ~IsaReset() {
    cpu::set_isa_for_testing("");
    cpu::set_bf16_dot_for_testing(true);
  }
};

// Checks y = x · Wᵀ + bias against a double-precision sum over the dense
// matrix, within 1e-5 of Σ|x·w| + |bias| (an f32 sum's bound with slack for
// the order). x is the f32 input, rounded to bf16 first when `bf16_inputs`.
void expect_product(const Packed& w, const std::vector<float>& x, int64_t n, const float* bias,
                    bool bf16_inputs, const std::vector<float>& y, const std::string& what) {
  int failures = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double want = bias ? bias[r] : 0.0, mag = bias ? std::fabs(bias[r]) : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        float xv = x[size_t(t * w.cols + c)];
        if (bf16_inputs) xv = bf16_to_f32(f32_to_bf16(xv));
        const double p = double(xv) * bf16_to_f32(w.dense[size_t(r * w.cols + c)]);
        want += p;
        mag += std::fabs(p);
      }
      const float got = y[size_t(t * w.rows + r)];
      if (!(std::fabs(got - want) <= 1e-5 * mag + 1e-30) && failures++ < 5)
        ADD_FAILURE() << what << ": y[" << t << ", " << r << "] = " << got << ", expected " << want;
    }
}

TEST(PackedWeights, PackingKeepsEveryValueAndZeroesThePaddingRows) {
  std::mt19937 rng(31);
  for (int64_t rows : {1, 15, 16, 17, 50})
    for (int64_t cols : {2, 30, 32, 34, 2048, 2050}) {
      const Packed p = make_packed(rows, cols, rng);
      const WeightMatrix w = p.view();
      ASSERT_EQ(w.stored_rows(), (rows + 15) / 16 * 16);
      ASSERT_EQ(w.nbytes(), size_t(w.stored_rows() * cols) * 2);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < w.stored_rows(); ++r) {
        if (r < rows) dequantize_row(w, r, row.data());
        for (int64_t c = 0; c < cols; ++c) {
          const uint16_t stored = p.packed[packed_bf16_index(cols, r, c)];
          const uint16_t want = r < rows ? p.dense[size_t(r * cols + c)] : uint16_t(0);
          ASSERT_EQ(stored, want) << rows << "x" << cols << " (" << r << ", " << c << ")";
          if (r < rows) {
            ASSERT_EQ(row[size_t(c)], bf16_to_f32(want));
          }
        }
      }
    }
}

TEST(PackedWeights, PackingRejectsWhatItCannotPack) {
  std::vector<uint16_t> odd(3 * 5);
  EXPECT_THROW(cpu::packed_bf16_view(WeightMatrix{DType::BF16, odd.data(), 3, 5}, nullptr),
               std::exception);
  std::vector<float> f32(4 * 4);
  EXPECT_THROW(cpu::packed_bf16_view(WeightMatrix{DType::F32, f32.data(), 4, 4}, nullptr),
               std::exception);
}

TEST(PackedWeights, MatmulIsTheProductWithTheDenseMatrix) {
  IsaReset reset;
  std::mt19937 rng(37);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (int64_t rows : {1, 16, 17, 47, 50, 130, 290})
      for (int64_t cols : {2, 34, 1026, 2050}) {
        const Packed w = make_packed(rows, cols, rng);
        const std::vector<float> bias = random_floats(size_t(rows), rng);
        for (int64_t n : {1, 3, 8, 9, 17, 25}) {
          if (rows * cols * n > 4'000'000) continue;  // the scalar reference's time
          const std::vector<float> x = random_floats(size_t(n * cols), rng);
          for (const std::string& isa : test::supported_isas())
            for (bool bf16_inputs : {false, true})
              for (bool dot : {true, false}) {
                if (dot && !bf16_inputs) continue;
                ASSERT_TRUE(cpu::set_isa_for_testing(isa));
                cpu::set_bf16_dot_for_testing(dot);
                const bool with_bias = (n + rows) % 2 == 0;
                std::vector<float> y(size_t(n * rows), NAN);
                cpu::matmul(pool, x.data(), n, w.view(), with_bias ? bias.data() : nullptr,
                            y.data(),
                            bf16_inputs ? cpu::MatmulInputs::Bf16 : cpu::MatmulInputs::F32);
                expect_product(w, x, n, with_bias ? bias.data() : nullptr, bf16_inputs, y,
                               isa + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                   " n=" + std::to_string(n) + (bf16_inputs ? " bf16" : " f32") +
                                   (dot ? "" : " (no dot products)") +
                                   " threads=" + std::to_string(threads));
                if (::testing::Test::HasFailure()) return;
              }
        }
      }
  }
}

TEST(PackedWeights, MatmulDoesNotReadPastThePackedMatrix) {
  // The packed matrix ends exactly at an inaccessible page: the kernels'
  // row vectors, panels and k blocks must stay inside stored_rows x cols.
  std::mt19937 rng(41);
  ThreadPool pool(2);
  for (int64_t rows : {16, 33, 96})
    for (int64_t cols : {2, 66, 1026}) {
      const Packed w = make_packed(rows, cols, rng);
      const test::GuardedCopy guarded(w.packed.data(), w.packed.size() * 2);
      WeightMatrix view = w.view();
      view.data = guarded.data();
      for (int64_t n : {1, 9, 40})
        for (bool bf16_inputs : {false, true}) {
          const std::vector<float> x = random_floats(size_t(n * cols), rng);
          std::vector<float> y(size_t(n * rows), NAN);
          cpu::matmul(pool, x.data(), n, view, nullptr, y.data(),
                      bf16_inputs ? cpu::MatmulInputs::Bf16 : cpu::MatmulInputs::F32);
          expect_product(w, x, n, nullptr, bf16_inputs, y,
                         "guarded " + std::to_string(rows) + "x" + std::to_string(cols));
        }
    }
}

}  // namespace
