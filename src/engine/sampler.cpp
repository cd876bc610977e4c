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

void log_softmax(const float* logits, int64_t n, std::vector<float>& out) {
  const float m = logits[argmax(logits, n)];
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - m);
  const double log_sum = std::log(sum) + m;
  out.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = float(double(logits[i]) - log_sum);
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

void Sampler::apply_penalties(float* logits, int64_t vocab, std::span<const int32_t> prompt,
                              std::span<const int32_t> output) {
  const auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (params_.repetition_penalty != 1.0f) {
    const float r = params_.repetition_penalty;
    std::vector<bool> seen(size_t(vocab), false);
    for (auto part : {prompt, output})
      for (int32_t id : part)
        if (in_vocab(id) && !seen[size_t(id)]) {
          seen[size_t(id)] = true;
          logits[id] = logits[id] > 0 ? logits[id] / r : logits[id] * r;
        }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    counts_.clear();
    for (int32_t id : output)
      if (in_vocab(id)) counts_[id]++;
    for (const auto& [id, count] : counts_)
      logits[id] -= params_.presence_penalty + params_.frequency_penalty * float(count);
  }
}

int32_t Sampler::sample(float* logits, int64_t vocab, std::span<const int32_t> prompt,
                        std::span<const int32_t> output) {
  apply_penalties(logits, vocab, prompt, output);
  if (params_.temperature <= 0.0f) return argmax(logits, vocab);
  candidates_.clear();
  for (int64_t i = 0; i < vocab; ++i)
    candidates_.emplace_back(logits[i] / params_.temperature, int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (params_.top_k > 0 && size_t(params_.top_k) < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(),
                      by_logit);
    candidates_.resize(size_t(params_.top_k));
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
  if (params_.min_p > 0.0f) {
    // The top candidate has weight exp(0) = 1.
    size_t n = 1;
    while (n < candidates_.size() && candidates_[n].first >= params_.min_p) ++n;
    total = 0.0;
    candidates_.resize(n);
    for (const auto& c : candidates_) total += c.first;
  }
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0.0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace tandem
