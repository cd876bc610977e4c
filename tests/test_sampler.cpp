#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/sampler.h"

using namespace tandem;

TEST(Sampler, GreedyTakesTheLowestIdAmongEqualMaxima) {
  float logits[] = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits, 4), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  float logits[] = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplingParams p{.temperature = 1.0f, .seed = 42};
  Sampler a(p), b(p);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 50; ++i) x.push_back(a.sample(logits, 5)), y.push_back(b.sample(logits, 5));
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 2u);  // it really samples
}

TEST(Sampler, TopKOneIsGreedyAndTopPKeepsTheNucleus) {
  float logits[] = {0.0f, 3.0f, 2.9f, -5.0f};
  Sampler k1(SamplingParams{.temperature = 1.0f, .top_k = 1, .seed = 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits, 4), 1);
  // p(1) ≈ 0.50, p(2) ≈ 0.46, p(0) ≈ 0.025: top_p 0.9 never yields 0 or 3.
  Sampler p(SamplingParams{.temperature = 1.0f, .top_p = 0.9f, .seed = 7});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) seen[p.sample(logits, 4)]++;
  EXPECT_EQ(seen.count(0) + seen.count(3), 0u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[2], 100);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p ∝ {e^3, e^2.9, e^0, e^-5}: min_p 0.2 keeps only ids 1 and 2.
  float logits[] = {0.0f, 3.0f, 2.9f, -5.0f};
  Sampler s(SamplingParams{.temperature = 1.0f, .min_p = 0.2f, .seed = 3});
  for (int i = 0; i < 300; ++i) {
    float copy[4];
    std::copy(logits, logits + 4, copy);
    int32_t id = s.sample(copy, 4);
    EXPECT_TRUE(id == 1 || id == 2) << id;
  }
}

TEST(Sampler, PenaltiesFollowHuggingFaceAndOpenAI) {
  // Repetition penalty divides positive and multiplies negative logits of
  // every token seen in prompt or output.
  float a[] = {2.0f, -1.0f, 1.9f};
  const int32_t prompt[] = {0, 1};
  Sampler rep(SamplingParams{.repetition_penalty = 2.0f});
  EXPECT_EQ(rep.sample(a, 3, prompt), 2);
  EXPECT_FLOAT_EQ(a[0], 1.0f);
  EXPECT_FLOAT_EQ(a[1], -2.0f);
  EXPECT_FLOAT_EQ(a[2], 1.9f);
  // Presence + frequency: subtract p + f * count for tokens in the output only.
  float b[] = {1.0f, 1.0f, 0.5f};
  const int32_t output[] = {0, 0, 1};
  Sampler pf(SamplingParams{.presence_penalty = 0.25f, .frequency_penalty = 0.5f});
  EXPECT_EQ(pf.sample(b, 3, {}, output), 2);
  EXPECT_FLOAT_EQ(b[0], 1.0f - 0.25f - 1.0f);
  EXPECT_FLOAT_EQ(b[1], 1.0f - 0.25f - 0.5f);
}

TEST(Sampler, LogSoftmaxSumsToOne) {
  float logits[] = {1000.0f, 999.0f, -50.0f};
  std::vector<float> lp;
  log_softmax(logits, 3, lp);
  double sum = 0;
  for (float x : lp) sum += std::exp(double(x));
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(lp[0] - lp[1], 1.0f, 1e-5);
}

namespace {

// The sampler as it was before it sorted lazily: every candidate sorted, the
// filters and the draw over the sorted list. The oracle for the lazy one.
int32_t full_sort_sample(const std::vector<float>& logits, const SamplingParams& p,
                         std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < logits.size(); ++i) c.emplace_back(logits[i] / p.temperature, int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p.top_k > 0 && size_t(p.top_k) < c.size()) {
    std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(), by_logit);
    c.resize(size_t(p.top_k));
  } else {
    std::sort(c.begin(), c.end(), by_logit);
  }
  const float top = c.front().first;
  double total = 0.0;
  for (auto& x : c) total += (x.first = std::exp(x.first - top));
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < c.size() && cum < p.top_p * total) cum += c[n++].first;
    c.resize(std::max<size_t>(n, 1));
    total = cum > 0 ? cum : c.front().first;
  }
  if (p.min_p > 0.0f) {
    size_t n = 1;
    while (n < c.size() && c[n].first >= p.min_p) ++n;
    c.resize(n);
    total = 0.0;
    for (auto& x : c) total += x.first;
  }
  double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (auto& x : c) {
    r -= x.first;
    if (r <= 0.0) return x.second;
  }
  return c.back().second;
}

}  // namespace

// Sorting only as far as the walks reach gives the tokens a full sort gives:
// 400 random cases (vocabularies of 2 to 6000, flat to peaked logits with
// ties, every mix of temperature, top-k, top-p and min-p), five draws each
// from one generator.
TEST(Sampler, LazySortingPicksWhatAFullSortPicks) {
  std::mt19937 rng(2024);
  const float temps[] = {0.3f, 1.0f, 1.7f};
  const int32_t ks[] = {0, 1, 7, 64, 5000};
  const float ps[] = {1.0f, 0.95f, 0.5f};
  const float mins[] = {0.0f, 0.02f, 0.3f};
  const float scales[] = {0.3f, 2.0f, 12.0f};
  for (int c = 0; c < 400; ++c) {
    const size_t vocab = 2 + rng() % 6000;
    std::normal_distribution<float> d(0.f, scales[rng() % 3]);
    std::vector<float> logits(vocab);
    for (float& x : logits) x = d(rng);
    for (size_t i = 0; i + 1 < vocab; i += 97) logits[i + 1] = logits[i];  // ties
    SamplingParams p;
    p.temperature = temps[rng() % 3];
    p.top_k = ks[rng() % 5];
    p.top_p = ps[rng() % 3];
    p.min_p = mins[rng() % 3];
    p.seed = uint64_t(c);
    Sampler lazy(p);
    std::mt19937_64 oracle_rng(p.seed);
    for (int draw = 0; draw < 5; ++draw) {
      std::vector<float> copy = logits;
      const int32_t want = full_sort_sample(logits, p, oracle_rng);
      ASSERT_EQ(lazy.sample(copy.data(), int64_t(vocab)), want)
          << "case " << c << " draw " << draw << " vocab " << vocab << " T " << p.temperature
          << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p;
    }
  }
}
