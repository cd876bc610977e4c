// Tests of the CPU thread pool and compute kernels. Every ISA path the
// processor supports is forced in turn (set_isa_for_testing) and compared
// with a double-precision reference.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "test_util.h"

using namespace tandem;

namespace {

// ---- Helpers ------------------------------------------------------------------

// Restores the run-time ISA choice when a test ends, even on failure.
struct IsaGuard {
  ~IsaGuard() { cpu::set_isa_for_testing(""); }
};

// Weights stored in `dtype`, plus the exact f32 value of each element.
struct TestWeights {
  DType dtype;
  int64_t rows, cols;
  std::vector<uint16_t> half;  // F16 / BF16 storage
  std::vector<float> full;     // F32 storage, and the exact values for every dtype

  WeightMatrix view() const {
    WeightMatrix w;
    w.dtype = dtype;
    w.rows = rows;
    w.cols = cols;
    w.data = dtype == DType::F32 ? static_cast<const void*>(full.data()) : half.data();
    return w;
  }
};

TestWeights make_weights(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  TestWeights w{dtype, rows, cols, {}, {}};
  w.full.resize(size_t(rows * cols));
  if (dtype != DType::F32) w.half.resize(w.full.size());
  for (size_t i = 0; i < w.full.size(); ++i) {
    float v = dist(rng);
    if (dtype == DType::BF16) {
      w.half[i] = f32_to_bf16(v);
      v = bf16_to_f32(w.half[i]);
    } else if (dtype == DType::F16) {
      w.half[i] = f32_to_f16(v);
      v = f16_to_f32(w.half[i]);
    }
    w.full[i] = v;
  }
  return w;
}

// The double-precision reference of x * W^T (without bias), and the
// magnitude sum |x * w| of each output that bounds an f32 sum's error.
struct Reference {
  std::vector<double> value, magnitude;  // [n, rows]
};

Reference reference(const float* x, int64_t n, const TestWeights& w) {
  Reference ref;
  ref.value.resize(size_t(n * w.rows));
  ref.magnitude.resize(ref.value.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double sum = 0, mag = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const double p = double(x[t * w.cols + c]) * w.full[size_t(r * w.cols + c)];
        sum += p;
        mag += std::fabs(p);
      }
      ref.value[size_t(t * w.rows + r)] = sum;
      ref.magnitude[size_t(t * w.rows + r)] = mag;
    }
  }
  return ref;
}

// Checks y against the reference: |y - ref| <= 1e-5 * (sum |x*w| + |bias|),
// the error bound of an f32 sum of that magnitude with slack for the order.
void expect_matmul_close(const Reference& ref, int64_t n, int64_t rows, const float* bias,
                         const float* y, const std::string& what) {
  constexpr double kTol = 1e-5;
  int failures = 0;
  for (int64_t t = 0; t < n && failures < 5; ++t) {
    for (int64_t r = 0; r < rows && failures < 5; ++r) {
      const size_t i = size_t(t * rows + r);
      const double want = ref.value[i] + (bias ? bias[r] : 0.0);
      const double mag = ref.magnitude[i] + (bias ? std::fabs(bias[r]) : 0.0);
      if (!(std::fabs(y[i] - want) <= kTol * mag + 1e-30)) {
        ADD_FAILURE() << what << ": y[" << t << ", " << r << "] = " << y[i] << ", expected " << want
                      << " (magnitude " << mag << ")";
        ++failures;
      }
    }
  }
}

std::string describe(const std::string& isa, DType dtype, int64_t n, int64_t rows, int64_t cols,
                     bool bias, int threads) {
  return isa + " " + std::string(dtype_name(dtype)) + " n=" + std::to_string(n) +
         " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
         (bias ? " +bias" : "") + " threads=" + std::to_string(threads);
}

// Runs matmul on every supported ISA for the given shapes and checks it.
void check_shapes(ThreadPool& pool, const std::vector<int64_t>& ns,
                  const std::vector<int64_t>& rows_list, const std::vector<int64_t>& cols_list,
                  uint32_t seed) {
  IsaGuard guard;
  std::mt19937 rng(seed);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t rows : rows_list) {
      for (int64_t cols : cols_list) {
        const TestWeights w = make_weights(dtype, rows, cols, rng);
        const std::vector<float> bias = test::random_floats(size_t(rows), rng);
        for (int64_t n : ns) {
          const std::vector<float> x = test::random_floats(size_t(n * cols), rng);
          const Reference ref = reference(x.data(), n, w);
          for (const std::string& isa : test::supported_isas()) {
            ASSERT_TRUE(cpu::set_isa_for_testing(isa));
            for (bool with_bias : {false, true}) {
              // NaN-filled output: a kernel that skips an element is caught.
              std::vector<float> y(size_t(n * rows), NAN);
              const float* b = with_bias ? bias.data() : nullptr;
              cpu::matmul(pool, x.data(), n, w.view(), b, y.data());
              expect_matmul_close(ref, n, rows, b, y.data(),
                                  describe(isa, dtype, n, rows, cols, with_bias, pool.size()));
              if (::testing::Test::HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// A buffer whose last byte is followed by an inaccessible page: a kernel that
// reads past the end of its input crashes the test instead of passing.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) {
    page_ = size_t(sysconf(_SC_PAGESIZE));
    span_ = (bytes + page_ - 1) / page_ * page_ + page_;
    void* p = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<char*>(p);
    mprotect(base_ + span_ - page_, page_, PROT_NONE);
    data_ = base_ + span_ - page_ - bytes;
  }
  ~GuardedBuffer() { munmap(base_, span_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }

 private:
  size_t page_ = 0, span_ = 0;
  char* base_ = nullptr;
  char* data_ = nullptr;
};

}  // namespace

// ---- ThreadPool -----------------------------------------------------------------

TEST(ThreadPool, SizeCountsTheCaller) {
  EXPECT_EQ(ThreadPool(1).size(), 1);
  EXPECT_EQ(ThreadPool(3).size(), 3);
  const int hw = std::max(1, int(std::thread::hardware_concurrency()));
  EXPECT_EQ(ThreadPool(0).size(), hw);
  EXPECT_EQ(ThreadPool(-1).size(), hw);
}

TEST(ThreadPool, VisitsEveryIndexExactlyOnceInValidChunks) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 7, 16, 63, 64, 100, 1000, 4097}) {
      for (int64_t grain : {0, 1, 2, 3, 16, 100, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        for (int rep = 0; rep < 50; ++rep) {
          std::atomic<int> chunks{0};
          std::atomic<bool> bad_chunk{false};
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
            chunks.fetch_add(1);
            // Chunks are non-empty, in range, and respect the grain unless the
            // whole range runs as one chunk.
            if (!(0 <= b && b < e && e <= n) || (e - b < grain && !(b == 0 && e == n)))
              bad_chunk = true;
            for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
          });
          ASSERT_FALSE(bad_chunk) << "threads=" << threads << " n=" << n << " grain=" << grain;
          ASSERT_LE(chunks.load(), 4 * threads);  // kChunksPerThread
          if (n > 0 && n <= std::max<int64_t>(grain, 1)) {
            ASSERT_EQ(chunks.load(), 1);
          }
        }
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[size_t(i)].load(), 50)
              << "threads=" << threads << " n=" << n << " grain=" << grain << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, ResultsAreVisibleToTheCaller) {
  // Plain (non-atomic) writes by the workers must be visible after return.
  ThreadPool pool(4);
  std::vector<int64_t> out(10000);
  for (int rep = 0; rep < 2000; ++rep) {
    pool.parallel_for(int64_t(out.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = i * rep;
    });
    for (size_t i = 0; i < out.size(); i += 997) ASSERT_EQ(out[i], int64_t(i) * rep);
  }
}

TEST(ThreadPool, WakesWorkersThatWentToSleep) {
  // Gaps longer than the spin time make the workers block on the condition
  // variable; every dispatch must still run all chunks.
  ThreadPool pool(2);
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum.fetch_add(i);
    });
    ASSERT_EQ(sum.load(), 999 * 1000 / 2);
  }
}

TEST(ThreadPool, PropagatesExceptionsAndStaysUsable) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 100; ++rep) {
      // Throw from the caller's chunk, from a worker's chunk, and from all.
      const int64_t thrower = rep % 3 == 0 ? 0 : rep % 3 == 1 ? 99 : -1;
      std::atomic<int64_t> visited{0};
      EXPECT_THROW(pool.parallel_for(100, 1,
                                     [&](int64_t b, int64_t e) {
                                       visited.fetch_add(e - b);
                                       if (thrower < 0 || (b <= thrower && thrower < e))
                                         throw std::runtime_error("boom");
                                     }),
                   std::runtime_error);
      EXPECT_EQ(visited.load(), 100);  // the other chunks still ran to the end
    }
    std::atomic<int64_t> sum{0};
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    EXPECT_EQ(sum.load(), 100);
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(4, 1, [&](int64_t b, int64_t e) {
    pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2) { sum.fetch_add((e - b) * (e2 - b2)); });
  });
  EXPECT_EQ(sum.load(), 40);
}

// ---- Kernels ----------------------------------------------------------------------

TEST(Kernels, IsaSelection) {
  IsaGuard guard;
  const std::string def(cpu::active_isa());
  EXPECT_TRUE(def == "avx512" || def == "avx2" || def == "scalar") << def;
  EXPECT_TRUE(cpu::set_isa_for_testing("scalar"));
  EXPECT_EQ(cpu::active_isa(), "scalar");
  EXPECT_FALSE(cpu::set_isa_for_testing("sse9"));
  EXPECT_EQ(cpu::active_isa(), "scalar");
  EXPECT_TRUE(cpu::set_isa_for_testing(""));
  EXPECT_EQ(cpu::active_isa(), def);
  std::printf("ISA paths tested here:");
  for (const auto& isa : test::supported_isas()) std::printf(" %s", isa.c_str());
  std::printf(" (default %s)\n", def.c_str());
}

TEST(Kernels, MatmulAwkwardShapes) {
  ThreadPool pool(2);
  check_shapes(pool, {1, 3, 17, 64}, {1, 7, 33}, {1, 15, 17, 100, 1000}, 1);
}

TEST(Kernels, MatmulLargerShapesSplitAcrossThreads) {
  // Rows spread over several chunks (row split), rows too few for that
  // (activation-row split), cols beyond one k block, n beyond one x tile, n
  // on both sides of the streaming / GEMM switch (kStreamMaxN = 16) and with
  // every remainder of the kernels' activation-row groups.
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    check_shapes(pool, {1, 2, 5, 16, 17, 70, 131}, {5, 130}, {64, 1031, 2100}, 2 + threads);
  }
}

TEST(Kernels, MatmulZeroCols) {
  IsaGuard guard;
  ThreadPool pool(2);
  const std::vector<float> bias = {1, 2, 3};
  for (const std::string& isa : test::supported_isas()) {
    ASSERT_TRUE(cpu::set_isa_for_testing(isa));
    for (int64_t n : {1, 4}) {
      WeightMatrix w;
      w.dtype = DType::BF16;
      w.rows = 3;
      w.cols = 0;
      std::vector<float> y(size_t(3 * n), NAN);
      const float x = 0;
      cpu::matmul(pool, &x, n, w, bias.data(), y.data());
      for (int64_t t = 0; t < n; ++t)
        for (int r = 0; r < 3; ++r) EXPECT_EQ(y[size_t(t * 3 + r)], bias[size_t(r)]) << isa;
    }
  }
}

TEST(Kernels, MatmulRejectsNonFloatWeights) {
  ThreadPool pool(1);
  WeightMatrix w;
  w.dtype = DType::I32;
  w.rows = w.cols = 1;
  const int32_t data = 1;
  w.data = &data;
  float x = 1, y = 0;
  EXPECT_THROW(cpu::matmul(pool, &x, 1, w, nullptr, &y), Error);
}

TEST(Kernels, MatmulDoesNotReadPastItsInputs) {
  // x and W end right before an unmapped page; tails must use masked or
  // bounded loads — in the streaming kernel (n up to 16) and the GEMM (17
  // and 33 rows: a partial micro-tile of activation rows).
  IsaGuard guard;
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t cols : {1, 3, 17, 33, 1030}) {
      for (int64_t n : {1, 3, 7, 17, 33}) {
        const int64_t rows = 9;
        const TestWeights ref = make_weights(dtype, rows, cols, rng);
        GuardedBuffer wbuf(ref.view().nbytes());
        std::memcpy(wbuf.as<char>(), ref.view().data, ref.view().nbytes());
        WeightMatrix w = ref.view();
        w.data = wbuf.as<void>();
        const std::vector<float> xv = test::random_floats(size_t(n * cols), rng);
        GuardedBuffer xbuf(xv.size() * sizeof(float));
        std::copy(xv.begin(), xv.end(), xbuf.as<float>());
        const Reference want = reference(xv.data(), n, ref);
        for (const std::string& isa : test::supported_isas()) {
          ASSERT_TRUE(cpu::set_isa_for_testing(isa));
          std::vector<float> y(size_t(n * rows), NAN);
          cpu::matmul(pool, xbuf.as<float>(), n, w, nullptr, y.data());
          expect_matmul_close(want, n, rows, nullptr, y.data(),
                              describe(isa, dtype, n, rows, cols, false, 2));
        }
      }
    }
  }
}

// Restores the bf16 dot products when a test ends, even on failure.
struct Bf16DotGuard {
  ~Bf16DotGuard() { cpu::set_bf16_dot_for_testing(true); }
};

std::vector<float> rounded_to_bf16(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}

TEST(Kernels, MatmulBf16InputsAreTheProductOfTheRoundedInputs) {
  // MatmulInputs::Bf16 over bf16 weights: the f32 product of x rounded to
  // bf16, on every ISA with and without the bf16 dot products — n on both
  // sides of gemm_min_rows and every remainder of the 6 x 4 micro-tiles,
  // rows split over threads or not, cols odd and past one 2,048 k block.
  // F32 and F16 weights ignore it (exact products).
  IsaGuard guard;
  Bf16DotGuard dot_guard;
  std::mt19937 rng(21);
  bool dot_tested = false;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (int64_t rows : {1, 5, 13, 130})
      for (int64_t cols : {1, 17, 33, 1031, 4100})
        for (int64_t n : {1, 16, 17, 23, 70}) {
          const std::vector<float> x = test::random_floats(size_t(n * cols), rng);
          for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
            const TestWeights w = make_weights(dtype, rows, cols, rng);
            const std::vector<float> bias = test::random_floats(size_t(rows), rng);
            const Reference ref = dtype == DType::BF16 ? reference(rounded_to_bf16(x).data(), n, w)
                                                       : reference(x.data(), n, w);
            for (const std::string& isa : test::supported_isas())
              for (bool dot : {true, false}) {
                ASSERT_TRUE(cpu::set_isa_for_testing(isa));
                cpu::set_bf16_dot_for_testing(dot);
                dot_tested = dot_tested || cpu::bf16_dot_products();
                std::vector<float> y(size_t(n * rows), NAN);
                cpu::matmul(pool, x.data(), n, w.view(), bias.data(), y.data(),
                            cpu::MatmulInputs::Bf16);
                expect_matmul_close(ref, n, rows, bias.data(), y.data(),
                                    describe(isa, dtype, n, rows, cols, true, threads) +
                                        " bf16 inputs" + (dot ? "" : " (no dot products)"));
                if (::testing::Test::HasFailure()) return;
              }
          }
        }
  }
  std::printf("bf16 dot products (AVX-512 BF16) %s\n",
              dot_tested ? "tested" : "absent on this processor: the rounded f32 path tested");
}

TEST(Kernels, MatmulBf16InputsDoNotReadPastTheWeights) {
  // The bf16 GEMM reads the weights in place: its tails must use masked
  // loads (rows of odd length, a k block's last partial 32 values).
  Bf16DotGuard dot_guard;
  ThreadPool pool(2);
  std::mt19937 rng(23);
  for (int64_t cols : {1, 3, 31, 33, 2049}) {
    for (int64_t n : {17, 33}) {
      const int64_t rows = 9;
      const TestWeights ref = make_weights(DType::BF16, rows, cols, rng);
      GuardedBuffer wbuf(ref.view().nbytes());
      std::memcpy(wbuf.as<char>(), ref.view().data, ref.view().nbytes());
      WeightMatrix w = ref.view();
      w.data = wbuf.as<void>();
      const std::vector<float> x = test::random_floats(size_t(n * cols), rng);
      const Reference want = reference(rounded_to_bf16(x).data(), n, ref);
      std::vector<float> y(size_t(n * rows), NAN);
      cpu::matmul(pool, x.data(), n, w, nullptr, y.data(), cpu::MatmulInputs::Bf16);
      expect_matmul_close(
          want, n, rows, nullptr, y.data(),
          describe(std::string(cpu::active_isa()), DType::BF16, n, rows, cols, false, 2) +
              " bf16 inputs");
    }
  }
}

TEST(Kernels, DotAndAxpy) {
  IsaGuard guard;
  std::mt19937 rng(11);
  for (const std::string& isa : test::supported_isas()) {
    ASSERT_TRUE(cpu::set_isa_for_testing(isa));
    for (int64_t n = 0; n <= 300; n += (n < 70 ? 1 : 37)) {
      const std::vector<float> a = test::random_floats(size_t(n), rng);
      const std::vector<float> b = test::random_floats(size_t(n), rng);
      GuardedBuffer ga(a.size() * 4), gb(b.size() * 4);  // end exactly at the guard page
      std::copy(a.begin(), a.end(), ga.as<float>());
      std::copy(b.begin(), b.end(), gb.as<float>());
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += double(a[size_t(i)]) * b[size_t(i)];
        mag += std::fabs(double(a[size_t(i)]) * b[size_t(i)]);
      }
      EXPECT_NEAR(cpu::dot(ga.as<float>(), gb.as<float>(), n), ref, 1e-5 * mag + 1e-30)
          << isa << " n=" << n;

      std::vector<float> y = b;
      const float alpha = 0.75f;
      cpu::axpy(alpha, ga.as<float>(), gb.as<float>(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = double(y[size_t(i)]) + double(alpha) * a[size_t(i)];
        ASSERT_NEAR(gb.as<float>()[i], want, 1e-6 * (std::fabs(want) + 1)) << isa << " n=" << n;
      }
    }
  }
}

// The gated activations on every ISA against double-precision formulas:
// odd lengths (the vector tails), arguments from -100 to 100 where exp
// under- and overflows, and ±inf / NaN passed through as libm's expf would.
// Both are g / (1 + e^a) · up; a, rounded to f32, carries a relative error
// of ~6e-8 · |a| into e^a, hence the tolerance (and past a = 88.7 e^a
// overflows f32, so results under ~1e-35 are 0).
TEST(Kernels, GatedActivationsMatchTheFormulas) {
  IsaGuard guard;
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> wide(-100.0f, 100.0f), narrow(-8.0f, 8.0f);
  const auto silu_arg = [](double g) { return -g; };
  const auto gelu_arg = [](double g) {
    return -2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g);
  };
  for (const std::string& isa : test::supported_isas()) {
    ASSERT_TRUE(cpu::set_isa_for_testing(isa));
    for (int64_t n : {1, 15, 16, 17, 100, 1000}) {
      std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        gate[size_t(i)] = i % 3 == 0 ? wide(rng) : narrow(rng);
        up[size_t(i)] = narrow(rng);
      }
      GuardedBuffer gs(gate.size() * 4), gg(gate.size() * 4), gu(up.size() * 4);
      std::copy(gate.begin(), gate.end(), gs.as<float>());
      std::copy(gate.begin(), gate.end(), gg.as<float>());
      std::copy(up.begin(), up.end(), gu.as<float>());
      cpu::silu_mul(gs.as<float>(), gu.as<float>(), n);
      cpu::gelu_tanh_mul(gg.as<float>(), gu.as<float>(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[size_t(i)], u = up[size_t(i)];
        for (bool is_silu : {true, false}) {
          const double a = is_silu ? silu_arg(g) : gelu_arg(g);
          const double want = g / (1.0 + std::exp(a)) * u;
          const float got = (is_silu ? gs : gg).as<float>()[i];
          ASSERT_NEAR(got, want, 3e-7 * (1.0 + std::fabs(a)) * std::fabs(want) + 1e-35)
              << isa << (is_silu ? " silu" : " gelu") << " g=" << g;
        }
      }
    }
    const float inf = INFINITY;
    std::vector<float> g = {inf, -inf, NAN, 0.0f}, u = {1.0f, 1.0f, 1.0f, 1.0f};
    std::vector<float> s = g;
    cpu::silu_mul(s.data(), u.data(), 4);
    EXPECT_EQ(s[0], inf) << isa;
    EXPECT_TRUE(std::isnan(s[1])) << isa;  // -inf / (1 + inf), as the formula
    EXPECT_TRUE(std::isnan(s[2])) << isa;
    EXPECT_EQ(s[3], 0.0f) << isa;
    cpu::gelu_tanh_mul(g.data(), u.data(), 4);
    EXPECT_EQ(g[0], inf) << isa;
    EXPECT_TRUE(std::isnan(g[2])) << isa;
    EXPECT_EQ(g[3], 0.0f) << isa;
  }
}
