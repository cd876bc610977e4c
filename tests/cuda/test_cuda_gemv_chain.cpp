// The persistent GEMV chain (gemv_chain.h) against double sums and against
// the same chain of gemv_bf16 launches. Tolerances:
//  - each phase: |gpu - sum| ≤ 1e-5 · Σ|w·x| + 1e-6 against double sums of
//    the same bf16 weights and the phase's own (device) input;
//  - a chain that reuses its buffers layer after layer (what a barrier
//    must make visible, and no block may read stale): the last output
//    within 1e-4 of its largest magnitude of gemv_bf16's chain (f32 sums
//    in another order, compounded over the phases).
// Every prefetch mode, with one block an SM and with the most that fit.
// Skipped, with the reason printed, where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/gemv_chain.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "gemv_reference.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

class CudaGemvChain : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

struct PhaseShape {
  int64_t rows, cols;
  cuda::GemvGate gate;
};

constexpr cuda::ChainPrefetch kModes[] = {cuda::ChainPrefetch::None, cuda::ChainPrefetch::L2,
                                          cuda::ChainPrefetch::Registers};

// Phases with their own buffers: odd output counts (a partial virtual
// block), columns from one chunk in all to several loads a lane, splits of
// 1 to 8 warps, both gates; each phase reads (a prefix of) the one
// before's output.
TEST_F(CudaGemvChain, EveryPhaseMatchesDoubleSums) {
  const std::vector<PhaseShape> shapes = {
      {1000, 256, cuda::GemvGate::None},    {2 * 300, 1000, cuda::GemvGate::SiLU},
      {4104, 37 * 8, cuda::GemvGate::None}, {2 * 2050, 4104, cuda::GemvGate::GeluTanh},
      {9, 2048, cuda::GemvGate::None},      {3000, 8, cuda::GemvGate::None},
      {96, 3000, cuda::GemvGate::None}};
  std::vector<std::vector<uint16_t>> weights;
  std::vector<cuda::DeviceBuffer> dw, dy;
  const auto x0 = random_floats(size_t(shapes[0].cols), 5);
  cuda::DeviceBuffer dx0 = upload(x0);
  std::vector<cuda::GemvChainPhase> phases;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const PhaseShape& s = shapes[i];
    weights.push_back(to_bf16(random_floats(size_t(s.rows * s.cols), uint32_t(10 + i), 0.1f)));
    dw.push_back(upload(weights.back()));
    const int64_t outputs = s.gate == cuda::GemvGate::None ? s.rows : s.rows / 2;
    dy.emplace_back(size_t(outputs) * sizeof(float));
    const float* in = i == 0 ? dx0.as<float>() : dy[i - 1].as<float>();
    phases.push_back({dw.back().as<uint16_t>(), s.rows, s.cols, in, dy.back().as<float>(), s.gate});
  }
  for (int blocks_per_sm : {1, 0})
    for (cuda::ChainPrefetch mode : kModes) {
      const std::string what =
          "blocks/SM " + std::to_string(blocks_per_sm) + ", prefetch " + std::to_string(int(mode));
      for (cuda::DeviceBuffer& y : dy) cudaMemset(y.get(), 0xff, y.bytes());  // NaN
      cuda::GemvChain chain(phases, blocks_per_sm);
      chain.run(nullptr, mode);
      std::vector<float> in = x0;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const PhaseShape& s = shapes[i];
        const bool gated = s.gate != cuda::GemvGate::None;
        const int64_t outputs = gated ? s.rows / 2 : s.rows;
        const std::vector<float> got = download<float>(dy[i], size_t(outputs));
        size_t bad = 0;
        for (int64_t o = 0; o < outputs; ++o) {
          double sum[2] = {0, 0}, mag = 0;
          for (int r = 0; r < (gated ? 2 : 1); ++r)
            for (int64_t c = 0; c < s.cols; ++c) {
              const double p =
                  double(bf16_to_f32(weights[i][size_t((o + r * outputs) * s.cols + c)])) *
                  double(in[size_t(c)]);
              sum[r] += p;
              mag += std::fabs(p);
            }
          // A gated output's bound: the gate's error through act (slope
          // at most ~1.1) times |up|, plus act(gate) times up's error.
          const double want = gated ? act(s.gate, sum[0]) * sum[1] : sum[0];
          const double bound =
              (gated ? 2 * (1 + std::fabs(sum[0]) + std::fabs(sum[1])) : 1) * (1e-5 * mag + 1e-6);
          if (!(std::fabs(got[size_t(o)] - want) <= bound) && bad++ < 3)
            ADD_FAILURE() << what << ", phase " << i << " [" << o << "]: gpu " << got[size_t(o)]
                          << " want " << want;
        }
        EXPECT_EQ(bad, 0u) << what << ", phase " << i;
        in = got;  // the next phase's input, as the device read it
      }
    }
}

// Four "layers" of four phases over the same four buffers, as a decode
// step's projections reuse theirs: against gemv_bf16's chain.
TEST_F(CudaGemvChain, ReusedBuffersMatchGemvLaunches) {
  const int64_t d = 264, q = 320, ff = 1032;
  cuda::DeviceBuffer x0 = upload(random_floats(size_t(d), 6)), qkv(size_t(q) * 4), o(size_t(d) * 4),
                     gu(size_t(ff) * 4), down(size_t(d) * 4);
  std::vector<cuda::DeviceBuffer> dw;
  std::vector<cuda::GemvChainPhase> phases;
  auto matrix = [&](int64_t rows, int64_t cols) {
    dw.push_back(
        upload(to_bf16(random_floats(size_t(rows * cols), uint32_t(100 + dw.size()), 0.08f))));
    return dw.back().as<uint16_t>();
  };
  for (int l = 0; l < 4; ++l) {
    const float* in = l == 0 ? x0.as<float>() : down.as<float>();
    phases.push_back({matrix(q, d), q, d, in, qkv.as<float>(), cuda::GemvGate::None});
    phases.push_back({matrix(d, q), d, q, qkv.as<float>(), o.as<float>(), cuda::GemvGate::None});
    phases.push_back(
        {matrix(2 * ff, d), 2 * ff, d, o.as<float>(), gu.as<float>(), cuda::GemvGate::GeluTanh});
    phases.push_back(
        {matrix(d, ff), d, ff, gu.as<float>(), down.as<float>(), cuda::GemvGate::None});
  }
  for (const cuda::GemvChainPhase& p : phases) {
    cuda::GemvFusion f;
    f.gate = p.gate;
    cuda::gemv_bf16(p.w, p.rows, p.cols, p.x, 1, p.y, nullptr, f);
  }
  const std::vector<float> want = download<float>(down, size_t(d));
  double scale = 0;
  for (float v : want) scale = std::max(scale, double(std::fabs(v)));
  ASSERT_GT(scale, 0.0);
  for (int blocks_per_sm : {1, 0})
    for (cuda::ChainPrefetch mode : kModes) {
      cudaMemset(down.get(), 0xff, down.bytes());
      cuda::GemvChain chain(phases, blocks_per_sm);
      chain.run(nullptr, mode);
      const std::vector<float> got = download<float>(down, size_t(d));
      for (int64_t i = 0; i < d; ++i)
        ASSERT_LE(std::fabs(got[size_t(i)] - want[size_t(i)]), 1e-4 * scale)
            << "blocks/SM " << blocks_per_sm << ", prefetch " << int(mode) << " [" << i << "]";
    }
}

TEST_F(CudaGemvChain, RejectsPhasesItCannotRun) {
  cuda::DeviceBuffer w(64 * 12 * 2), x(12 * 4), y(64 * 4);
  const cuda::GemvChainPhase odd_cols{w.as<uint16_t>(),    64, 12, x.as<float>(), y.as<float>(),
                                      cuda::GemvGate::None};
  try {
    cuda::GemvChain chain({odd_cols});
    FAIL() << "12 columns accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("phase 0 (64 x 12)"), std::string::npos) << e.what();
  }
}

}  // namespace
