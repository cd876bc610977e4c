#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

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
