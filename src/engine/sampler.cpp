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

// The filters and the draw walk the candidates from the most likely down,
// usually only a few of them, so the candidates are sorted only as far as a
// walk reaches: each extension partial-sorts the next, geometrically larger,
// stretch of the rest (which is never above the sorted prefix), instead of
// sorting the whole vocabulary (262k entries for Gemma) for every token.
// The walks see the same order as a full sort, so the token is the one a full
// sort would give, up to the summation order of the total (a relative
// 1e-16 on the draw's range).
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
  size_t sorted = 0;  // candidates_[0, sorted) hold the largest, in order
  if (params_.top_k > 0 && size_t(params_.top_k) < candidates_.size()) {
    // A small k: a heap of k in one pass, sorted; a large one: the k largest
    // found, their order left to the walks.
    const auto k = candidates_.begin() + params_.top_k;
    if (params_.top_k <= 4096) {
      std::partial_sort(candidates_.begin(), k, candidates_.end(), by_logit);
      sorted = size_t(params_.top_k);
    } else {
      std::nth_element(candidates_.begin(), k, candidates_.end(), by_logit);
    }
    candidates_.resize(size_t(params_.top_k));
  }
  auto sort_to = [&](size_t n) {
    if (n <= sorted) return;
    n = std::min(candidates_.size(), std::max({n, size_t(64), 2 * sorted}));
    std::partial_sort(candidates_.begin() + std::ptrdiff_t(sorted),
                      candidates_.begin() + std::ptrdiff_t(n), candidates_.end(), by_logit);
    sorted = n;
  };
  sort_to(1);
  const float max_logit = candidates_.front().first;
  auto weight = [&](size_t i) { return std::exp(candidates_[i].first - max_logit); };
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) total += weight(i);
  size_t kept = candidates_.size();
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t n = 0;
    while (n < kept && cumulative < params_.top_p * total) {
      sort_to(n + 1);
      cumulative += weight(n++);
    }
    kept = std::max<size_t>(n, 1);
    total = cumulative > 0 ? cumulative : weight(0);
  }
  if (params_.min_p > 0.0f) {
    // The top candidate has weight exp(0) = 1.
    size_t n = 1;
    while (n < kept) {
      sort_to(n + 1);
      if (weight(n) < params_.min_p) break;
      ++n;
    }
    kept = n;
    total = 0.0;
    for (size_t i = 0; i < kept; ++i) total += weight(i);
  }
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (size_t i = 0; i < kept; ++i) {
    sort_to(i + 1);
    r -= weight(i);
    if (r <= 0.0) return candidates_[i].second;
  }
  sort_to(kept);
  return candidates_[kept - 1].second;
}

}  // namespace tandem
