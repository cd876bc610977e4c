#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace tandem {

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature <= 0.0f) return argmax(logits, vocab);
  candidates_.clear();
  for (int64_t i = 0; i < vocab; ++i)
    candidates_.emplace_back(logits[i] / params_.temperature, int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  const float max_logit = candidates_.front().first;
  double total = 0.0;
  for (auto& c : candidates_) total += (c.first = std::exp(c.first - max_logit));
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t n = 0;
    while (n < candidates_.size() && cumulative < params_.top_p * total)
      cumulative += candidates_[n++].first;
    candidates_.resize(std::max<size_t>(n, 1));
    total = cumulative > 0 ? cumulative : candidates_.front().first;
  }
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0.0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace tandem
