#include <gtest/gtest.h>

#include <map>

#include "engine/sampler.h"

using namespace tandem;

TEST(Sampler, GreedyTakesTheLowestIdAmongEqualMaxima) {
  float logits[] = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(logits, 4), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  float logits[] = {1.0f, 1.1f, 0.9f, 1.05f, 0.2f};
  SamplingParams p{1.0f, 0, 1.0f, 42};
  Sampler a(p), b(p);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 50; ++i) x.push_back(a.sample(logits, 5)), y.push_back(b.sample(logits, 5));
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 2u);  // it really samples
}

TEST(Sampler, TopKOneIsGreedyAndTopPKeepsTheNucleus) {
  float logits[] = {0.0f, 3.0f, 2.9f, -5.0f};
  Sampler k1(SamplingParams{1.0f, 1, 1.0f, 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(logits, 4), 1);
  // p(1) ≈ 0.50, p(2) ≈ 0.46, p(0) ≈ 0.025: top_p 0.9 never yields 0 or 3.
  Sampler p(SamplingParams{1.0f, 0, 0.9f, 7});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) seen[p.sample(logits, 4)]++;
  EXPECT_EQ(seen.count(0) + seen.count(3), 0u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[2], 100);
}
