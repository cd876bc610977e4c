// Token sampling from one row of logits.
//
// Contract, in order: penalties adjust the logits (repetition_penalty the
// Hugging Face way over prompt and output: positive logits divided, negative
// multiplied; presence and frequency penalties the OpenAI way over the
// output only); temperature 0 then means greedy (argmax, lowest id on ties);
// otherwise logits / temperature, top-k, top-p (nucleus), min-p (drop tokens
// whose probability is below min_p x the top one), and one draw from a
// generator seeded by `seed`: the same seed and inputs give the same token.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/sampling_params.h"

namespace tandem {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // `prompt` and `output` are the sequence so far (for penalties); `logits`
  // may be modified in place by the penalties.
  int32_t sample(float* logits, int64_t vocab, std::span<const int32_t> prompt = {},
                 std::span<const int32_t> output = {});
  // One draw in [0, 1) from the generator, for a sampler elsewhere (the
  // device's) that takes the place of sample() for a token.
  double uniform();

 private:
  void apply_penalties(float* logits, int64_t vocab, std::span<const int32_t> prompt,
                       std::span<const int32_t> output);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::unordered_map<int32_t, int32_t> counts_;
};

int32_t argmax(const float* x, int64_t n);

// log_softmax of one row, in double for accuracy, written as float.
void log_softmax(const float* logits, int64_t n, std::vector<float>& out);

}  // namespace tandem
