// Every CUDA kernel against the CPU backend (the reference oracle), on random
// data with odd shapes. Tolerances, per op:
//  - gemv_bf16: |gpu - cpu| ≤ 1e-5 · Σ|w·x| + 1e-6 (f32 sums in another order);
//  - gemv_bf16 and gemv_f32 with each fusion (input norm, bias, residual
//    add, gated activation, an activation times a per-token vector;
//    gemv_bf16 also the sandwich norm's pre_add, scaled or not, and its
//    residual_out) against the unfused math in double
//    (gemv_reference.h states the bound);
//  - rmsnorm, gated activations, soft-cap: 2e-6 relative + 1e-6 absolute
//    (fast-math exp/tanh);
//  - embedding gather: exact;
//  - skinny_gemm_bf16: |gpu - sum| ≤ 1e-5 · Σ|w·x| + 1e-6 against double
//    sums of the same bf16 operands.
// Skipped, with the reason printed, where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "gemv_reference.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

class CudaKernels : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                  double abs, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  size_t bad = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= abs + rel * std::fabs(cpu[i])) && bad++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
  EXPECT_EQ(bad, 0u) << what;
}

TEST_F(CudaKernels, GemvBf16MatchesCpuMatmul) {
  ThreadPool pool(2);
  struct Shape {
    int64_t rows, cols;
  };
  // Odd row counts, columns with and without the 16-byte path, batch 1..17.
  for (Shape s : {Shape{37, 64}, Shape{1000, 200}, Shape{129, 72}, Shape{33, 70}, Shape{2048, 2048},
                  Shape{5, 4104}, Shape{64, 8192}})
    for (int64_t n : {1, 2, 3, 8, 9, 16, 17}) {
      const auto wf = random_floats(size_t(s.rows * s.cols), 1, 0.05f);
      const auto w16 = to_bf16(wf);
      const auto x = random_floats(size_t(n * s.cols), 2);
      WeightMatrix wm;
      wm.dtype = DType::BF16;
      wm.data = w16.data();
      wm.rows = s.rows;
      wm.cols = s.cols;
      std::vector<float> want(size_t(n * s.rows));
      cpu::matmul(pool, x.data(), n, wm, nullptr, want.data());
      // The bound: the sum of |w·x| per output.
      std::vector<float> mag(want.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < s.rows; ++r) {
          double m = 0;
          for (int64_t c = 0; c < s.cols; ++c)
            m += std::fabs(bf16_to_f32(w16[size_t(r * s.cols + c)]) * x[size_t(t * s.cols + c)]);
          mag[size_t(t * s.rows + r)] = float(m);
        }
      auto dw = upload(w16);
      auto dx = upload(x);
      cuda::DeviceBuffer dy(want.size() * sizeof(float));
      cuda::gemv_bf16(dw.as<uint16_t>(), s.rows, s.cols, dx.as<float>(), n, dy.as<float>(),
                      nullptr);
      const auto got = download<float>(dy, want.size());
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 1e-5 * mag[i] + 1e-6) && bad++ < 3)
          ADD_FAILURE() << s.rows << "x" << s.cols << " n=" << n << " [" << i << "] gpu " << got[i]
                        << " cpu " << want[i];
      EXPECT_EQ(bad, 0u) << s.rows << "x" << s.cols << " n=" << n;
    }
}

// Row r of bf16 weights w times token t of bf16 activations x (rows of
// `cols`) in double, and Σ |products| (the scale of the f32 sum's error).
struct DoubleDot {
  double sum = 0, mag = 0;
};
DoubleDot bf16_dot(const std::vector<uint16_t>& w, int64_t r, const std::vector<uint16_t>& x,
                   int64_t t, int64_t cols) {
  DoubleDot d;
  for (int64_t c = 0; c < cols; ++c) {
    const double p =
        double(bf16_to_f32(w[size_t(r * cols + c)])) * double(bf16_to_f32(x[size_t(t * cols + c)]));
    d.sum += p;
    d.mag += std::fabs(p);
  }
  return d;
}

// The gated activations in double: SiLU or tanh-approximated GELU.
double activation(cuda::GemvGate act, double g) {
  return act == cuda::GemvGate::SiLU
             ? g / (1 + std::exp(-g))
             : 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

// The skinny GEMM's block layouts under test: {row groups a block, column
// splits over a cluster}.
constexpr std::pair<int, int> kSkinnyLayouts[] = {
    {1, 1}, {cuda::kSkinnyRowGroups, 1}, {1, 2}, {1, 3}, {1, cuda::kSkinnyMaxColSplits}};

// skinny_gemm_bf16 against double sums of the same bf16 operands: odd row
// counts (a partial 16-row tile), columns that end mid-step (1,152 = 18
// steps of 64, 80 = one and a quarter) and uneven column shares over the
// 8 warps, 1 to 32 tokens (one to four 8-token mma tiles, full and partial), and an output
// stride wider than the rows (the decoder writes row tiles of a wider y); with one row group a
// block and kSkinnyRowGroups (teams of 2 warps, partial groups past the rows), and one group
// with its columns split over clusters of 2 to 4 blocks (splits past a matrix's columns leave
// warps without steps: 80 columns over 32 warps).
TEST_F(CudaKernels, SkinnyGemmMatchesDoubleSums) {
  struct Shape {
    int64_t rows, cols;
  };
  for (Shape s : {Shape{16, 64}, Shape{37, 1152}, Shape{130, 2048}, Shape{24, 8192}, Shape{7, 80},
                  Shape{33, 16}})
    for (int64_t n : {1, 3, 8, 9, 16, 21, 32}) {
      const auto w16 = to_bf16(random_floats(size_t(s.rows * s.cols), 41, 0.05f));
      const auto x16 = to_bf16(random_floats(size_t(n * s.cols), 42, 2.f));
      const int64_t ldy = s.rows + 3;
      auto dw = upload(w16);
      auto dx = upload(x16);
      for (auto [groups, splits] : kSkinnyLayouts) {
        if (splits > 1 && !cuda::clusters_supported())
          continue;  // refused: SkinnyGemmColumnSplitsNeedClusters
        std::vector<float> sentinel(size_t(n * ldy), 1234.5f);
        auto dy = upload(sentinel);
        ASSERT_TRUE(
            cuda::skinny_gemm_fits(dw.as<uint16_t>(), s.rows, s.cols, dx.as<uint16_t>(), n));
        cuda::skinny_gemm_bf16(dw.as<uint16_t>(), s.rows, s.cols, dx.as<uint16_t>(), n,
                               dy.as<float>(), ldy, nullptr, groups, splits);
        const auto got = download<float>(dy, sentinel.size());
        size_t bad = 0;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < ldy; ++r) {
            const float g = got[size_t(t * ldy + r)];
            if (r >= s.rows) {  // past the rows: untouched
              if (g != 1234.5f && bad++ < 3) ADD_FAILURE() << "wrote past the rows at " << r;
              continue;
            }
            const auto [want, mag] = bf16_dot(w16, r, x16, t, s.cols);
            if (!(std::fabs(g - want) <= 1e-5 * mag + 1e-6) && bad++ < 3)
              ADD_FAILURE() << s.rows << "x" << s.cols << " n=" << n << " groups=" << groups
                            << " splits=" << splits << " [" << t << ", " << r << "] gpu " << g
                            << " want " << want;
          }
        EXPECT_EQ(bad, 0u) << s.rows << "x" << s.cols << " n=" << n << " groups=" << groups
                           << " splits=" << splits;
      }
    }
  // Outside its shapes it says so (the decoder then takes cuBLAS).
  cuda::DeviceBuffer w(64 * 72 * 2), x(33 * 72 * 2);
  EXPECT_FALSE(cuda::skinny_gemm_fits(w.as<uint16_t>(), 64, 72, x.as<uint16_t>(), 1));
  EXPECT_FALSE(cuda::skinny_gemm_fits(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 33));
  EXPECT_THROW(
      cuda::skinny_gemm_bf16(w.as<uint16_t>(), 64, 72, x.as<uint16_t>(), 1, nullptr, 64, nullptr),
      Error);
  cuda::DeviceBuffer y(64 * 4);
  EXPECT_THROW(cuda::skinny_gemm_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1, y.as<float>(),
                                      64, nullptr, 3),
               Error);  // 1 or kSkinnyRowGroups row groups a block
}

// The gated variant (a fused gate/up matrix, the activation in the
// epilogue) against act(gate) · up from double sums, partial 8-row groups
// (37 and 100 pairs) and tiles; the bf16 copy is the f32 output rounded to
// nearest even.
TEST_F(CudaKernels, SkinnyGemmGatedMatchesDoubleSums) {
  struct Shape {
    int64_t pairs, cols;
  };
  for (Shape s : {Shape{8, 64}, Shape{37, 1152}, Shape{100, 80}})
    for (cuda::GemvGate act : {cuda::GemvGate::SiLU, cuda::GemvGate::GeluTanh})
      for (int64_t n : {1, 3, 8, 9, 16, 21, 32}) {
        const int64_t F = s.pairs;
        const auto w16 = to_bf16(random_floats(size_t(2 * F * s.cols), 43, 0.05f));
        const auto x16 = to_bf16(random_floats(size_t(n * s.cols), 44, 2.f));
        auto dw = upload(w16);
        auto dx = upload(x16);
        for (auto [groups, splits] : kSkinnyLayouts) {
          if (splits > 1 && !cuda::clusters_supported()) continue;
          cuda::DeviceBuffer dy(size_t(n * F) * sizeof(float)), dyb(size_t(n * F) * 2);
          cuda::skinny_gemm_gated_bf16(dw.as<uint16_t>(), F, s.cols, dx.as<uint16_t>(), n, act,
                                       dy.as<float>(), dyb.as<uint16_t>(), nullptr, groups, splits);
          const auto got = download<float>(dy, size_t(n * F));
          const auto got16 = download<uint16_t>(dyb, size_t(n * F));
          const auto rounded = to_bf16(got);
          size_t bad = 0;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t j = 0; j < F; ++j) {
              const DoubleDot gate = bf16_dot(w16, j, x16, t, s.cols),
                              up = bf16_dot(w16, F + j, x16, t, s.cols);
              const double a = activation(act, gate.sum), u = up.sum;
              const double want = a * u;
              const double tol =
                  1e-5 * (1.2 * gate.mag * std::fabs(u) + std::fabs(a) * up.mag) + 1e-6;
              const size_t at = size_t(t * F + j);
              if (!(std::fabs(got[at] - want) <= tol) && bad++ < 3)
                ADD_FAILURE() << F << " pairs x " << s.cols << " n=" << n << " [" << t << ", " << j
                              << "] gpu " << got[at] << " want " << want;
              if (got16[at] != rounded[at] && bad++ < 3)
                ADD_FAILURE() << "bf16 copy at [" << t << ", " << j
                              << "] is not the rounded output";
            }
          EXPECT_EQ(bad, 0u) << F << " pairs x " << s.cols << " n=" << n << " groups=" << groups
                             << " splits=" << splits;
        }
      }
  cuda::DeviceBuffer w(64 * 64 * 2), x(64 * 2), y(64 * 4);
  EXPECT_THROW(cuda::skinny_gemm_gated_bf16(w.as<uint16_t>(), 32, 64, x.as<uint16_t>(), 1,
                                            cuda::GemvGate::None, y.as<float>(), nullptr, nullptr),
               Error);
}

// The plain product with Gemma 4's per-layer gate in the epilogue
// (skinny_gemm_times_bf16): act(w_r · x_t) · times[t, r] against double
// sums, the multipliers read from rows wider than the matrix's (the
// per-layer inputs' stride), partial 16-row groups and tiles, every block
// layout; the bf16 copy is the f32 output rounded to nearest even.
TEST_F(CudaKernels, SkinnyGemmTimesMatchesDoubleSums) {
  struct Shape {
    int64_t rows, cols;
  };
  for (Shape s : {Shape{256, 1536}, Shape{37, 1152}, Shape{16, 80}})
    for (cuda::GemvGate act : {cuda::GemvGate::SiLU, cuda::GemvGate::GeluTanh})
      for (int64_t n : {1, 9, 32}) {
        const int64_t stride = 3 * s.rows + 5;
        const auto w16 = to_bf16(random_floats(size_t(s.rows * s.cols), 45, 0.05f));
        const auto x16 = to_bf16(random_floats(size_t(n * s.cols), 46, 2.f));
        const auto times = random_floats(size_t(n * stride), 47, 1.f);
        auto dw = upload(w16);
        auto dx = upload(x16);
        auto dt = upload(times);
        for (auto [groups, splits] : kSkinnyLayouts) {
          if (splits > 1 && !cuda::clusters_supported()) continue;
          cuda::DeviceBuffer dy(size_t(n * s.rows) * sizeof(float)), dyb(size_t(n * s.rows) * 2);
          // The multipliers at an offset into their rows, as a layer's slice.
          cuda::skinny_gemm_times_bf16(dw.as<uint16_t>(), s.rows, s.cols, dx.as<uint16_t>(), n, act,
                                       dt.as<float>() + s.rows, stride, dy.as<float>(),
                                       dyb.as<uint16_t>(), nullptr, groups, splits);
          const auto got = download<float>(dy, size_t(n * s.rows));
          const auto got16 = download<uint16_t>(dyb, size_t(n * s.rows));
          const auto rounded = to_bf16(got);
          size_t bad = 0;
          for (int64_t t = 0; t < n; ++t)
            for (int64_t r = 0; r < s.rows; ++r) {
              const DoubleDot g = bf16_dot(w16, r, x16, t, s.cols);
              const double m = times[size_t(t * stride + s.rows + r)];
              const double want = activation(act, g.sum) * m;
              const double tol = 1e-5 * 1.2 * g.mag * std::fabs(m) + 1e-6;
              const size_t at = size_t(t * s.rows + r);
              if (!(std::fabs(got[at] - want) <= tol) && bad++ < 3)
                ADD_FAILURE() << s.rows << "x" << s.cols << " n=" << n << " [" << t << ", " << r
                              << "] gpu " << got[at] << " want " << want;
              if (got16[at] != rounded[at] && bad++ < 3)
                ADD_FAILURE() << "bf16 copy at [" << t << ", " << r
                              << "] is not the rounded output";
            }
          EXPECT_EQ(bad, 0u) << s.rows << "x" << s.cols << " n=" << n << " groups=" << groups
                             << " splits=" << splits;
        }
      }
  cuda::DeviceBuffer w(64 * 64 * 2), x(64 * 2), y(64 * 4), t(64 * 4);
  EXPECT_THROW(cuda::skinny_gemm_times_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1,
                                            cuda::GemvGate::None, t.as<float>(), 64, y.as<float>(),
                                            nullptr, nullptr),
               Error);  // no activation
  EXPECT_THROW(cuda::skinny_gemm_times_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1,
                                            cuda::GemvGate::SiLU, t.as<float>(), 63, y.as<float>(),
                                            nullptr, nullptr),
               Error);  // multiplier rows narrower than the matrix's
}

// The current device's launch limits are its own launch_limits, and a
// usable device has SMs and opt-in shared memory of at least 48 KiB;
// clusters are reported exactly on sm_90 and newer.
TEST_F(CudaKernels, CurrentLaunchLimitsAreTheDevicesOwn) {
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  const cuda::LaunchLimits mine = cuda::current_launch_limits(), its = cuda::launch_limits(device);
  EXPECT_EQ(mine.cc_major, its.cc_major);
  EXPECT_EQ(mine.multiprocessors, its.multiprocessors);
  EXPECT_EQ(mine.smem_optin, its.smem_optin);
  EXPECT_GT(mine.multiprocessors, 0);
  EXPECT_GE(mine.smem_optin, size_t(48) << 10);
  EXPECT_EQ(cuda::clusters_supported(), mine.cc_major >= 9);
}

// The split rule: 1 without clusters, never above `most`, two 64-column
// steps a warp at least, and enough splits for a block an SM where the
// columns allow; split layouts the kernel cannot take are refused with a
// message that names the device requirement or the limit.
TEST_F(CudaKernels, SkinnyGemmColumnSplitsNeedClusters) {
  EXPECT_EQ(cuda::skinny_col_splits(1152, 6912, false, 1), 1);
  const int s = cuda::skinny_col_splits(1152, 6912, false, cuda::kSkinnyMaxColSplits);
  EXPECT_EQ(cuda::skinny_col_splits(1152, 1024, false, cuda::kSkinnyMaxColSplits), 1);
  cuda::DeviceBuffer w(64 * 64 * 2), x(64 * 2), y(64 * 4);
  if (!cuda::clusters_supported()) {
    EXPECT_EQ(s, 1);
    try {
      cuda::skinny_gemm_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1, y.as<float>(), 64,
                             nullptr, 1, 2);
      ADD_FAILURE() << "column splits launched without clusters";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sm_90"), std::string::npos) << e.what();
    }
    return;
  }
  const int sms = cuda::current_launch_limits().multiprocessors;
  ASSERT_GT(sms, 0);
  // 72 units of 16 rows, 108 steps: min(4, ceil(SMs / 72)) splits.
  EXPECT_EQ(s, std::min(cuda::kSkinnyMaxColSplits, (sms + 71) / 72));
  // Row groups that fill the SMs, or all but a quarter of them: no split.
  EXPECT_EQ(cuda::skinny_col_splits(16 * int64_t(sms), 8192, false, cuda::kSkinnyMaxColSplits), 1);
  EXPECT_EQ(cuda::skinny_col_splits(16 * int64_t(sms) * 3 / 4 + 16, 8192, false,
                                    cuda::kSkinnyMaxColSplits),
            1);
  // 1,024 columns over 2 splits would leave a warp one step; 2,048 do not.
  EXPECT_EQ(cuda::skinny_col_splits(64, 1024, false, cuda::kSkinnyMaxColSplits), 1);
  EXPECT_EQ(cuda::skinny_col_splits(64, 2048, false, cuda::kSkinnyMaxColSplits), 2);
  // Gated: 8 pairs a unit (72 of them).
  EXPECT_EQ(cuda::skinny_col_splits(2 * 576, 6912, true, cuda::kSkinnyMaxColSplits), s);
  EXPECT_THROW(cuda::skinny_gemm_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1, y.as<float>(),
                                      64, nullptr, cuda::kSkinnyRowGroups, 2),
               Error);
  EXPECT_THROW(cuda::skinny_gemm_bf16(w.as<uint16_t>(), 64, 64, x.as<uint16_t>(), 1, y.as<float>(),
                                      64, nullptr, 1, cuda::kSkinnyMaxColSplits + 1),
               Error);
}

// Every fusion on both weight types and every kernel path: 16-byte bf16
// chunks (cols % 8 == 0), float4 f32 rows (cols % 4 == 0) and the
// one-element path (cols 70), batches 1 to 9 (one and two runs of 8), odd
// row counts (the gated cases need even ones).
TEST_F(CudaKernels, GemvFusionsMatchTheUnfusedMath) {
  struct Shape {
    int64_t rows, cols;
  };
  for (Shape s : {Shape{64, 64}, Shape{130, 200}, Shape{37, 72}, Shape{34, 70}, Shape{1024, 2048},
                  Shape{42, 2056}, Shape{64, 8192}, Shape{256, 800}})
    for (bool bf16 : {true, false})
      for (const HostFusion& f : fusion_cases(s.rows, s.cols))
        for (int64_t n : {1, 2, 3, 5, 8, 9}) {
          const auto wf = random_floats(size_t(s.rows * s.cols), 21, 0.05f);
          const auto w16 = to_bf16(wf);
          std::vector<float> W(wf.size());
          for (size_t i = 0; i < W.size(); ++i) W[i] = bf16 ? bf16_to_f32(w16[i]) : wf[i];
          const auto x = random_floats(size_t(n * s.cols), 22, 2.f);
          const auto base = random_floats(size_t(n * s.rows), 23);
          const int64_t outputs = f.gate != cuda::GemvGate::None ? s.rows / 2 : s.rows;
          auto dw16 = upload(w16);
          auto dwf = upload(wf);
          auto dx = upload(x);
          auto dy = upload(f.accumulate ? base : std::vector<float>(size_t(n * outputs), 0.f));
          DeviceFusion df(f);
          if (bf16)
            cuda::gemv_bf16(dw16.as<uint16_t>(), s.rows, s.cols, dx.as<float>(), n, dy.as<float>(),
                            nullptr, df.fusion);
          else
            cuda::gemv_f32(dwf.as<float>(), s.rows, s.cols, dx.as<float>(), n, dy.as<float>(),
                           nullptr, df.fusion);
          expect_fused_gemv(download<float>(dy, size_t(n * outputs)), W, s.rows, s.cols, x, n, f,
                            base,
                            std::string(bf16 ? "bf16 " : "f32 ") + std::to_string(s.rows) + "x" +
                                std::to_string(s.cols) + " n=" + std::to_string(n) + " " + f.name);
        }
}

TEST_F(CudaKernels, GemvPreAddMatchesTheUnfusedMath) {
  struct Shape {
    int64_t rows, cols;
  };
  // 1536 x 1152 and 40 x 2056: batch 1's deeper loads (gated and plain), a partial last round.
  // 2560 and 5376 columns (Gemma 3 4B's and 27B's widths): the staged rows
  // take more than 48 KiB of shared memory (2560 at batch 2, 5376 at both),
  // so the kernel opts in to more beside its static shared memory.
  for (Shape s : {Shape{64, 64}, Shape{130, 200}, Shape{37, 72}, Shape{1536, 1152}, Shape{40, 2056},
                  Shape{64, 2560}, Shape{34, 5376}})
    for (int64_t n : {1, 2})
      for (const HostFusion& f : pre_add_cases(s.rows, s.cols, n)) {
        const auto wf = random_floats(size_t(s.rows * s.cols), 31, 0.05f);
        const auto w16 = to_bf16(wf);
        std::vector<float> W(wf.size());
        for (size_t i = 0; i < W.size(); ++i) W[i] = bf16_to_f32(w16[i]);
        const auto x = random_floats(size_t(n * s.cols), 32, 2.f);
        const int64_t outputs = f.gate != cuda::GemvGate::None ? s.rows / 2 : s.rows;
        auto dw16 = upload(w16);
        auto dx = upload(x);
        auto dy = upload(std::vector<float>(size_t(n * outputs), 0.f));
        DeviceFusion df(f);
        cuda::gemv_bf16(dw16.as<uint16_t>(), s.rows, s.cols, dx.as<float>(), n, dy.as<float>(),
                        nullptr, df.fusion);
        const std::string what = std::to_string(s.rows) + "x" + std::to_string(s.cols) +
                                 " n=" + std::to_string(n) + " " + f.name;
        expect_fused_gemv(download<float>(dy, size_t(n * outputs)), W, s.rows, s.cols, x, n, f, {},
                          what);
        expect_residual_out(download<float>(df.residual_out, size_t(n * s.cols)), x, n, s.cols, f,
                            what);
      }
}

// Batch 1's gated GEMV over more gate/up pairs than one wave of two-pair
// warps holds at any occupancy (8 blocks of 8 warps on every SM), and over
// just more than one wave at its own occupancy (4 blocks an SM) with rows
// of 3,072 columns, which splits them in 4 column shares (the past-a-wave
// rule of column_split_in_waves; ministral-3-3b's gate/up): the gated
// fusions and the gated pre_add one against the unfused math (the blocks
// past the first wave, which a shape sized for one wave leaves out).
TEST_F(CudaKernels, GemvGatedPastAWaveMatchesTheUnfusedMath) {
  const int sms = cuda::current_launch_limits().multiprocessors;
  ASSERT_GT(sms, 0);
  const int64_t one_wave = int64_t(4) * 8 * sms;  // two-pair warps
  struct Shape {
    int64_t rows, cols;
    int split;
  };
  for (const Shape sh :
       {Shape{2 * (int64_t(8) * 8 * sms * 2 + 3), 64, 1}, Shape{4 * (one_wave + 8), 3072, 4}}) {
    const int64_t rows = sh.rows, cols = sh.cols;
    const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
    EXPECT_EQ(cuda::gemv_bf16_split(rows, cols, 1, true), sh.split) << shape;
    const cuda::GemvLaunchShape launched = cuda::gemv_bf16_launch_shape(rows, cols, 1, true);
    EXPECT_EQ(launched.split, sh.split) << shape;
    EXPECT_EQ(launched.rows_per_warp, 4) << shape;                      // two gate/up pairs
    EXPECT_EQ(launched.warps, (rows / 2 + 1) / 2 * sh.split) << shape;  // pairs, two a warp
    EXPECT_EQ(launched.wave_warps, one_wave) << shape;                  // 4 blocks of 8 warps an SM
    const auto wf = random_floats(size_t(rows * cols), 24, 0.05f);
    const auto w16 = to_bf16(wf);
    std::vector<float> W(wf.size());
    for (size_t i = 0; i < W.size(); ++i) W[i] = bf16_to_f32(w16[i]);
    const auto x = random_floats(size_t(cols), 25, 2.f);
    auto dw16 = upload(w16);
    auto dx = upload(x);
    std::vector<HostFusion> cases;
    for (const HostFusion& f : fusion_cases(rows, cols))
      if (f.gate != cuda::GemvGate::None) cases.push_back(f);
    cases.push_back(pre_add_cases(rows, cols, 1).front());
    ASSERT_EQ(cases.size(), 3u);
    for (const HostFusion& f : cases) {
      auto dy = upload(std::vector<float>(size_t(rows / 2), 0.f));
      DeviceFusion df(f);
      cuda::gemv_bf16(dw16.as<uint16_t>(), rows, cols, dx.as<float>(), 1, dy.as<float>(), nullptr,
                      df.fusion);
      expect_fused_gemv(download<float>(dy, size_t(rows / 2)), W, rows, cols, x, 1, f, {},
                        shape + " " + f.name);
    }
  }
}

// The shapes above that take the column-split paths (ColumnShare): each
// split (2, 4, 8; uneven shares for 2056 and 4104 columns), plain, gated
// and pre_add, and that batches above 2 and short rows do not split.
TEST_F(CudaKernels, GemvSplitsTheColumnsOfShortMatrices) {
  EXPECT_EQ(cuda::gemv_bf16_split(64, 8192, 1, false), 8);
  EXPECT_EQ(cuda::gemv_bf16_split(64, 8192, 2, true), 8);
  EXPECT_GE(cuda::gemv_bf16_split(1024, 2048, 1, false), 2);
  EXPECT_EQ(cuda::gemv_bf16_split(42, 2056, 1, false), 8);
  EXPECT_EQ(cuda::gemv_bf16_split(5, 4104, 2, false), 8);
  EXPECT_EQ(cuda::gemv_bf16_split(1536, 1152, 1, false), 4);
  EXPECT_EQ(cuda::gemv_bf16_split(256, 800, 1, false), 2);
  EXPECT_EQ(cuda::gemv_bf16_split(256, 800, 2, false), 2);
  EXPECT_EQ(cuda::gemv_bf16_split(64, 8192, 3, false), 1);
  EXPECT_EQ(cuda::gemv_bf16_split(130, 200, 1, false), 1);
  EXPECT_EQ(cuda::gemv_bf16_split(33, 70, 1, false), 1);
}

// Batch 1 takes the largest split whose warps fit in one wave of 4 blocks
// of 8 warps on every SM (each warp keeping at least 32 loads), so no split
// spills past a wave (the shapes of llama-3.2-1b's qkv, o and down,
// gemma-3-1b's down — 8 shares, 1.09 waves, under the 1.25-wave rule —
// gemma-4-e2b's q/k/v, ministral-3-3b's qkv).
TEST_F(CudaKernels, GemvBatch1SplitStaysWithinAWave) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  const int64_t most = int64_t(4) * 8 * sms;  // warps
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {3072, 2048}, {2048, 2048}, {2048, 8192}, {1152, 6912}, {2560, 1536}, {6144, 3072}}) {
    const int split = cuda::gemv_bf16_split(rows, cols, 1, false);
    const int64_t units = rows / 2, chunks = cols / 8;  // two rows a warp, 8 columns a load
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    EXPECT_LE(units * split, std::max<int64_t>(most, units)) << what;
    if (split < 8 && chunks / (2 * split) >= 32) {
      EXPECT_GT(units * split * 2, most) << what << ": a larger split fits";
    }
  }
}

TEST_F(CudaKernels, GemvRejectsFusionsItCannotDo) {
  cuda::DeviceBuffer w(64 * 64 * 2), x(64 * 4), y(64 * 4);
  cuda::GemvFusion gated_add;
  gated_add.gate = cuda::GemvGate::SiLU;
  gated_add.accumulate = true;
  EXPECT_THROW(cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x.as<float>(), 1, y.as<float>(), nullptr,
                               gated_add),
               Error);
  cuda::GemvFusion gated;
  gated.gate = cuda::GemvGate::SiLU;
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 63, 64, x.as<float>(), 1, y.as<float>(), nullptr, gated),
      Error);
  // pre_add: bf16 rows of cols % 8 == 0, batches of at most 2, with
  // normalize, a weight and a residual_out; never f32 weights.
  cuda::DeviceBuffer o(64 * 4 * 3), ow(64 * 4), res(64 * 4 * 3);
  cuda::GemvFusion pre;
  pre.normalize = true;
  pre.pre_add = o.as<float>();
  pre.pre_add_weight = ow.as<float>();
  pre.residual_out = res.as<float>();
  cuda::DeviceBuffer x3(64 * 4 * 3), y3(64 * 4 * 3), wf(64 * 64 * 4);
  EXPECT_NO_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x3.as<float>(), 2, y3.as<float>(), nullptr, pre));
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x3.as<float>(), 3, y3.as<float>(), nullptr, pre),
      Error);
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 60, x3.as<float>(), 1, y3.as<float>(), nullptr, pre),
      Error);
  EXPECT_THROW(
      cuda::gemv_f32(wf.as<float>(), 64, 64, x3.as<float>(), 1, y3.as<float>(), nullptr, pre),
      Error);
  cuda::GemvFusion no_out = pre;
  no_out.residual_out = nullptr;
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x3.as<float>(), 1, y3.as<float>(), nullptr, no_out),
      Error);
  cuda::GemvFusion no_weight = pre;  // (no input norm is fine: Gemma 4's per-layer gate)
  no_weight.pre_add_weight = nullptr;
  EXPECT_THROW(cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x3.as<float>(), 1, y3.as<float>(), nullptr,
                               no_weight),
               Error);
  // pre_add_scale needs pre_add; times needs its activation and excludes
  // the gate and the residual add.
  cuda::GemvFusion scaled;
  scaled.pre_add_scale = 0.5f;
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x.as<float>(), 1, y.as<float>(), nullptr, scaled),
      Error);
  cuda::GemvFusion times;
  times.times = ow.as<float>();
  times.times_stride = 64;
  EXPECT_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x.as<float>(), 1, y.as<float>(), nullptr, times),
      Error);
  times.times_act = cuda::GemvGate::SiLU;
  EXPECT_NO_THROW(
      cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x.as<float>(), 1, y.as<float>(), nullptr, times));
  for (const bool gate : {true, false}) {
    cuda::GemvFusion both = times;
    if (gate)
      both.gate = cuda::GemvGate::SiLU;
    else
      both.accumulate = true;
    EXPECT_THROW(
        cuda::gemv_bf16(w.as<uint16_t>(), 64, 64, x.as<float>(), 1, y.as<float>(), nullptr, both),
        Error);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_F(CudaKernels, RmsnormMatchesCpu) {
  for (int64_t dim : {1, 31, 256, 1000, 2304})
    for (bool weighted : {true, false}) {
      const int64_t n = 7;
      const auto x = random_floats(size_t(n * dim), 3, 3.f);
      const auto w = random_floats(size_t(dim), 4);
      std::vector<float> want(x.size());
      cpu::rmsnorm(x.data(), weighted ? w.data() : nullptr, n, dim, 1e-6f, want.data());
      auto dx = upload(x);
      auto dw = upload(w);
      cuda::rmsnorm(dx.as<float>(), weighted ? dw.as<float>() : nullptr, n, dim, 1e-6f,
                    dx.as<float>(), nullptr);  // in place
      expect_close(download<float>(dx, x.size()), want, 2e-6, 1e-6,
                   "rmsnorm dim " + std::to_string(dim));
    }
}

// residual_norm: h = (h + d) · s (or rmsnorm(d) · w_d; s = 1 or a layer
// scalar), then x = rmsnorm(h) · w_x, against the CPU ops composed, over
// every register-tile size of the kernel (dims up to 1024, 1536, 2048,
// 4096, 8192) and the loop fallback above.
TEST_F(CudaKernels, ResidualNormMatchesCpu) {
  for (int64_t dim : {5, 640, 1152, 2048, 2304, 5376, 8192, 9000})
    for (int mode = 0; mode < 4; ++mode) {  // plain add; post-normed delta; no next norm; scaled
      const int64_t n = 3;
      const auto h = random_floats(size_t(n * dim), 7, 2.f), d = random_floats(size_t(n * dim), 8);
      const auto wd = random_floats(size_t(dim), 9), wx = random_floats(size_t(dim), 10);
      std::vector<float> want_h = h, normed(d.size()), want_x(h.size());
      if (mode == 1 || mode == 3) cpu::rmsnorm(d.data(), wd.data(), n, dim, 1e-6f, normed.data());
      const float scale = mode == 3 ? 0.37f : 1.f;
      for (size_t i = 0; i < h.size(); ++i)
        want_h[i] = (want_h[i] + (mode == 1 || mode == 3 ? normed[i] : d[i])) * scale;
      cpu::rmsnorm(want_h.data(), wx.data(), n, dim, 1e-6f, want_x.data());
      auto dh = upload(h), dd = upload(d), dwd = upload(wd), dwx = upload(wx);
      cuda::DeviceBuffer dx(h.size() * 4);
      cuda::residual_norm(dh.as<float>(), dd.as<float>(),
                          mode == 1 || mode == 3 ? dwd.as<float>() : nullptr, dwx.as<float>(),
                          mode == 2 ? nullptr : dx.as<float>(), n, dim, 1e-6f, nullptr, scale);
      const std::string what =
          "residual_norm dim " + std::to_string(dim) + " mode " + std::to_string(mode);
      expect_close(download<float>(dh, h.size()), want_h, 2e-6, 1e-6, what + " h");
      if (mode != 2) expect_close(download<float>(dx, h.size()), want_x, 2e-6, 1e-6, what + " x");
    }
}

// The bf16 twins (rmsnorm's y_bf16, residual_norm's x_bf16, the gated
// halves' out_bf16: a GEMM's input without a split_bf16 launch): each f32
// output as without a twin, and the twin exactly those outputs rounded to
// bf16 (nearest even, as split_bf16's hi part and f32_to_bf16). The gated
// halves also against the CPU's act(gate) · up.
TEST_F(CudaKernels, Bf16TwinsAreTheOutputsRounded) {
  const int64_t n = 5;
  for (int64_t dim : {33, 1152, 2304, 9000}) {
    const auto h = random_floats(size_t(n * dim), 21, 2.f), d = random_floats(size_t(n * dim), 22);
    const auto w = random_floats(size_t(dim), 23), w2 = random_floats(size_t(dim), 24);
    auto check = [&](const cuda::DeviceBuffer& f32, const cuda::DeviceBuffer& twin,
                     const std::vector<float>& plain, const std::string& what) {
      const auto got = download<float>(f32, plain.size());
      const auto bits = download<uint16_t>(twin, plain.size());
      size_t bad = 0;
      for (size_t i = 0; i < plain.size(); ++i) {
        if (got[i] != plain[i] && bad++ < 3)
          ADD_FAILURE() << what << " [" << i << "] " << got[i] << " vs " << plain[i];
        if (bits[i] != f32_to_bf16(got[i]) && bad++ < 3)
          ADD_FAILURE() << what << " twin [" << i << "] " << bits[i] << " vs "
                        << f32_to_bf16(got[i]);
      }
      EXPECT_EQ(bad, 0u) << what;
    };
    const std::string at = " dim " + std::to_string(dim);
    auto dh = upload(h), dw = upload(w);
    cuda::DeviceBuffer y(h.size() * 4), twin(h.size() * 2);
    cuda::rmsnorm(dh.as<float>(), dw.as<float>(), n, dim, 1e-6f, y.as<float>(), nullptr);
    const auto plain_norm = download<float>(y, h.size());
    cuda::rmsnorm(dh.as<float>(), dw.as<float>(), n, dim, 1e-6f, y.as<float>(), nullptr,
                  twin.as<uint16_t>());
    check(y, twin, plain_norm, "rmsnorm" + at);

    auto dd = upload(d), dw2 = upload(w2), dh2 = upload(h);
    cuda::residual_norm(dh.as<float>(), dd.as<float>(), dw.as<float>(), dw2.as<float>(),
                        y.as<float>(), n, dim, 1e-6f, nullptr);
    const auto plain_x = download<float>(y, h.size());
    cuda::residual_norm(dh2.as<float>(), dd.as<float>(), dw.as<float>(), dw2.as<float>(),
                        y.as<float>(), n, dim, 1e-6f, nullptr, 1.f, twin.as<uint16_t>());
    check(y, twin, plain_x, "residual_norm" + at);

    // Gated halves: gu = [n, 2 · dim] (gate, then up).
    const auto gu = random_floats(size_t(2 * n * dim), 25, 3.f);
    auto dgu = upload(gu);
    for (int act = 0; act < 2; ++act) {
      std::vector<float> want(size_t(n * dim)), up(size_t(n * dim));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < dim; ++i) {
          want[size_t(t * dim + i)] = gu[size_t(t * 2 * dim + i)];
          up[size_t(t * dim + i)] = gu[size_t(t * 2 * dim + dim + i)];
        }
      (act == 0 ? cpu::silu_mul : cpu::gelu_tanh_mul)(want.data(), up.data(), n * dim);
      auto halves = act == 0 ? cuda::silu_mul_halves : cuda::gelu_tanh_mul_halves;
      // One value a thread, and four (the default where the rows allow it).
      for (const char* vec4 : {"0", "1"}) {
        setenv("TANDEM_CUDA_GATED_VEC4", vec4, 1);
        const std::string what = (act == 0 ? "silu halves" : "gelu halves") + at + " vec4=" + vec4;
        halves(dgu.as<float>(), n, dim, y.as<float>(), nullptr, nullptr);
        const auto plain = download<float>(y, want.size());
        expect_close(plain, want, 2e-6, 1e-6, what);
        halves(dgu.as<float>(), n, dim, y.as<float>(), nullptr, twin.as<uint16_t>());
        check(y, twin, plain, what);
      }
      unsetenv("TANDEM_CUDA_GATED_VEC4");
    }
  }
}

TEST_F(CudaKernels, GatedActivationsAndSoftcapMatchCpu) {
  const int64_t n = 100003;
  const auto g = random_floats(size_t(n), 5, 4.f), u = random_floats(size_t(n), 6);
  for (int act = 0; act < 2; ++act)
    for (int64_t len : {n, n - 3}) {  // n - 3 = 100,000: the four-value path
      setenv("TANDEM_CUDA_GATED_VEC4", "1", 1);
      std::vector<float> want(g.begin(), g.begin() + len);
      (act == 0 ? cpu::silu_mul : cpu::gelu_tanh_mul)(want.data(), u.data(), len);
      auto dg = upload(g);
      auto du = upload(u);
      (act == 0 ? cuda::silu_mul : cuda::gelu_tanh_mul)(dg.as<float>(), du.as<float>(), len,
                                                        nullptr);
      expect_close(download<float>(dg, size_t(len)), want, 2e-6, 1e-6,
                   (act == 0 ? "silu " : "gelu ") + std::to_string(len));
      unsetenv("TANDEM_CUDA_GATED_VEC4");
    }
  std::vector<float> want = g;
  cpu::softcap(want.data(), n, 30.f);
  auto dg = upload(g);
  cuda::softcap(dg.as<float>(), n, 30.f, nullptr);
  expect_close(download<float>(dg, size_t(n)), want, 2e-6, 1e-6, "softcap");
}

TEST_F(CudaKernels, EmbeddingGatherIsExact) {
  const int64_t vocab = 1000, dim = 77;
  const auto table = to_bf16(random_floats(size_t(vocab * dim), 7));
  const std::vector<int32_t> ids = {0, 999, 5, 5, 123};
  const float scale = 8.5f;
  auto dt = upload(table);
  auto di = upload(ids);
  cuda::DeviceBuffer out(ids.size() * size_t(dim) * sizeof(float));
  cuda::embed_rows_bf16(dt.as<uint16_t>(), dim, di.as<int32_t>(), int64_t(ids.size()), scale,
                        out.as<float>(), nullptr);
  const auto got = download<float>(out, ids.size() * size_t(dim));
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_EQ(got[t * size_t(dim) + size_t(i)],
                bf16_to_f32(table[size_t(ids[t] * dim + i)]) * scale);
}

TEST(CudaRuntime, ReportsDevicesOrWhyNot) {
  std::string why;
  const int n = cuda::device_count(&why);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
    std::printf("[cuda] no device: %s (runtime %s, driver %s)\n", why.c_str(),
                cuda::runtime_version().c_str(), cuda::driver_version().c_str());
    return;
  }
  const cuda::DeviceInfo d = cuda::device_info(0);
  EXPECT_GT(d.total_bytes, 0u);
  EXPECT_GE(d.cc_major, 7);
  std::printf("[cuda] %s sm_%d%d, %d SMs, %.1f GB, nominal %.0f GB/s, runtime %s, driver %s\n",
              d.name.c_str(), d.cc_major, d.cc_minor, d.multiprocessors, d.total_bytes / 1e9,
              d.peak_bandwidth_gbs, cuda::runtime_version().c_str(),
              cuda::driver_version().c_str());
}

}  // namespace
