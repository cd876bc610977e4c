// Token sampling from one row of logits.
// Contract: temperature 0 is greedy (argmax, lowest id on ties); otherwise
// logits / temperature, then top-k, then top-p (nucleus) over the remaining
// probabilities, then one draw from a generator seeded by `seed`, so the same
// seed and logits give the same token.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;
  int32_t top_k = 0;   // 0 = off
  float top_p = 1.0f;  // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t argmax(const float* x, int64_t n);

}  // namespace tandem
