// The device sampler (cuda::sample_rows) against the CPU Sampler's contract
// (engine/sampler.h): greedy equals the CPU argmax, penalties move the same
// logits the same way, and for temperature sampling with top-k, top-p and
// min-p every drawn token is in the CPU's kept set, drawn as often as its
// probability says: over N evenly spaced draws each token's count is within
// 2 of N · p (the device walks ids in order, so each token owns one interval
// of the draw). Skipped, with the reason printed, where no CUDA device is
// usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/runtime.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"

using namespace tandem;
using namespace tandem::cuda_test;

namespace {

class CudaSampling : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

// Samples each params row on the device (logits are modified by penalties).
std::vector<int32_t> sample(std::vector<float>& logits, int64_t vocab,
                            const std::vector<cuda::SampleRow>& rows,
                            const std::vector<cuda::PenaltyToken>& penalties = {}) {
  cuda::DeviceBuffer dl = upload(logits), dp = upload(rows), dpen = upload(penalties),
                     out(rows.size() * 4);
  cuda::sample_rows(dl.as<float>(), int64_t(rows.size()), vocab, dp.as<cuda::SampleRow>(),
                    dpen.as<cuda::PenaltyToken>(), int64_t(penalties.size()), out.as<int32_t>(),
                    nullptr);
  cudaDeviceSynchronize();
  std::vector<int32_t> ids(rows.size());
  out.download(ids.data(), ids.size() * 4);
  dl.download(logits.data(), logits.size() * 4);
  return ids;
}

// The CPU Sampler's kept tokens and their probabilities (its filters, in
// its order: top-k, top-p, min-p), for one row.
std::map<int32_t, double> kept_distribution(const std::vector<float>& row,
                                            const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < row.size(); ++i) c.emplace_back(row[i] / p.temperature, int32_t(i));
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first; });
  if (p.top_k > 0 && size_t(p.top_k) < c.size()) c.resize(size_t(p.top_k));
  const float top = c.front().first;
  std::vector<double> w;
  double total = 0;
  for (auto& x : c) total += w.emplace_back(std::exp(x.first - top));
  if (p.top_p < 1.f) {
    double cum = 0;
    size_t n = 0;
    while (n < c.size() && cum < p.top_p * total) cum += w[n++];
    c.resize(n);
    w.resize(n);
  }
  if (p.min_p > 0.f) {
    size_t n = 1;
    while (n < c.size() && w[n] >= p.min_p) ++n;
    c.resize(n);
    w.resize(n);
  }
  total = 0;
  for (double x : w) total += x;
  std::map<int32_t, double> out;
  for (size_t i = 0; i < c.size(); ++i) out[c[i].second] = w[i] / total;
  return out;
}

TEST_F(CudaSampling, GreedyIsTheCpuArgmaxLowestIdOnTies) {
  const int64_t vocab = 50021, rows = 5;
  std::vector<float> logits = random_floats(size_t(vocab * rows), 1, 2.f);
  // Row 1: a tie for the top between ids 7 and 40000; row 3: all equal.
  logits[size_t(vocab + 40000)] = logits[size_t(vocab + 7)] = 50.f;
  std::fill(logits.begin() + 3 * vocab, logits.begin() + 4 * vocab, 0.25f);
  std::vector<cuda::SampleRow> params(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) params[size_t(r)].row = int32_t(rows - 1 - r);
  const std::vector<float> original = logits;
  const auto ids = sample(logits, vocab, params);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(ids[size_t(r)], argmax(original.data() + (rows - 1 - r) * vocab, vocab)) << r;
  EXPECT_EQ(ids[size_t(rows - 1 - 1)], 7);
  EXPECT_EQ(ids[size_t(rows - 1 - 3)], 0);
}

TEST_F(CudaSampling, ARowWithNanGivesMinusOne) {
  const int64_t vocab = 1000;
  std::vector<float> logits = random_floats(size_t(2 * vocab), 2, 1.f);
  logits[size_t(vocab + 999)] = NAN;
  std::vector<cuda::SampleRow> params(2);
  params[1].row = 1;
  params[1].temperature = 0.8f;
  const auto ids = sample(logits, vocab, params);
  EXPECT_GE(ids[0], 0);
  EXPECT_EQ(ids[1], -1);
}

TEST_F(CudaSampling, PenaltiesMatchTheCpuSampler) {
  const int64_t vocab = 4099;
  const std::vector<float> base = random_floats(size_t(vocab), 3, 1.f);
  const std::vector<int32_t> prompt = {5, 9, 9, 100, 4000};
  const std::vector<int32_t> output = {9, 17, 17, 17, 4000};
  for (auto [rep, pres, freq] : {std::tuple{1.3f, 0.f, 0.f}, std::tuple{1.f, 0.5f, 0.f},
                                 std::tuple{1.f, 0.f, 0.7f}, std::tuple{0.8f, -0.4f, 0.3f}}) {
    SamplingParams sp;
    sp.repetition_penalty = rep;
    sp.presence_penalty = pres;
    sp.frequency_penalty = freq;
    std::vector<float> cpu = base;
    // Make the penalized tokens compete for the top, both signs.
    for (int32_t id : {5, 9, 17, 100, 4000}) cpu[size_t(id)] = id % 2 ? 3.1f : -0.2f;
    std::vector<float> gpu = cpu;
    Sampler sampler(sp);
    const int32_t want = sampler.sample(cpu.data(), vocab, prompt, output);
    std::map<int32_t, cuda::PenaltyToken> touched;
    for (int32_t id : prompt) touched[id] = {0, id, 0, 1};
    for (int32_t id : output) {
      touched[id].id = id;
      touched[id].seen = 1;
      touched[id].count++;
    }
    std::vector<cuda::PenaltyToken> pen;
    for (auto& [id, t] : touched) pen.push_back(t);
    cuda::SampleRow row;
    row.repetition_penalty = rep;
    row.presence_penalty = pres;
    row.frequency_penalty = freq;
    const auto ids = sample(gpu, vocab, {row}, pen);
    EXPECT_EQ(ids[0], want) << rep << " " << pres << " " << freq;
    for (int64_t i = 0; i < vocab; ++i) ASSERT_EQ(gpu[size_t(i)], cpu[size_t(i)]) << i;
  }
}

TEST_F(CudaSampling, DrawsFollowTheCpuKeptDistribution) {
  const int64_t vocab = 3001;
  const int n = 4000;
  const std::vector<float> row = random_floats(size_t(vocab), 4, 2.5f);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  for (const Case& c :
       {Case{1.f, 0, 1.f, 0.f}, Case{0.7f, 20, 1.f, 0.f}, Case{1.f, 0, 0.9f, 0.f},
        Case{1.2f, 0, 1.f, 0.05f}, Case{0.9f, 50, 0.8f, 0.02f}, Case{2.f, 3000, 0.5f, 0.f}}) {
    SamplingParams sp;
    sp.temperature = c.temperature;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.min_p = c.min_p;
    const auto want = kept_distribution(row, sp);
    std::vector<float> logits;
    std::vector<cuda::SampleRow> params(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      params[size_t(i)].row = int32_t(i % 8);  // eight copies of the row
      params[size_t(i)].temperature = c.temperature;
      params[size_t(i)].top_k = c.top_k;
      params[size_t(i)].top_p = c.top_p;
      params[size_t(i)].min_p = c.min_p;
      params[size_t(i)].uniform = (i + 0.5) / n;
    }
    for (int k = 0; k < 8; ++k) logits.insert(logits.end(), row.begin(), row.end());
    const auto ids = sample(logits, vocab, params);
    std::map<int32_t, int> count;
    for (int32_t id : ids) {
      ASSERT_TRUE(want.count(id)) << "token " << id << " is outside the kept set (T "
                                  << c.temperature << " k " << c.top_k << " p " << c.top_p
                                  << " min_p " << c.min_p << ")";
      count[id]++;
    }
    for (auto [id, p] : want) EXPECT_NEAR(count[id], p * n, 2.0) << "token " << id;
  }
}

TEST_F(CudaSampling, AGemmaSizedVocabularyKeepsItsMass) {
  // 262,144 logits all equal: the fixed-point mass must not overflow, and
  // the draw must cover the whole range.
  const int64_t vocab = 262144;
  std::vector<float> logits(size_t(vocab), 1.5f);
  std::vector<cuda::SampleRow> params(3);
  const double draws[3] = {0.0, 0.5, 0.999999};
  for (int i = 0; i < 3; ++i) {
    params[size_t(i)].temperature = 1.f;
    params[size_t(i)].uniform = draws[i];
  }
  const auto ids = sample(logits, vocab, params);
  EXPECT_EQ(ids[0], 0);
  EXPECT_NEAR(ids[1], vocab / 2, 1);
  EXPECT_NEAR(ids[2], vocab - 1, 1);
}

}  // namespace
