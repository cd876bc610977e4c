// Time of the CPU Sampler (engine/sampler.h) per token on one row of logits
// shaped like a language model's (a few likely tokens over a long tail):
//
//   sampler_bench [--vocab 262144] [--iters 200]
//
// Prints, as JSON lines, µs per sample (the row copy each sample starts
// from taken out) for greedy, temperature alone, and temperature with
// top-k / top-p / min-p.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "engine/sampler.h"

using namespace tandem;

int main(int argc, char** argv) {
  int64_t vocab = 262144, iters = 200;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--vocab")) vocab = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::atoll(argv[i + 1]);
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> tail(0.f, 2.f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& x : logits) x = tail(rng);
  for (int i = 0; i < 8; ++i) logits[size_t(rng() % size_t(vocab))] = 18.f + float(i);  // the head
  struct Case {
    const char* name;
    SamplingParams p;
  };
  const Case cases[] = {
      {"greedy", SamplingParams{}},
      {"temperature 1.0", SamplingParams{.temperature = 1.0f}},
      {"temperature 0.8, top_p 0.95", SamplingParams{.temperature = 0.8f, .top_p = 0.95f}},
      {"temperature 0.8, top_k 40", SamplingParams{.temperature = 0.8f, .top_k = 40}},
      {"temperature 1.0, min_p 0.05", SamplingParams{.temperature = 1.0f, .min_p = 0.05f}},
  };
  // Each sample gets a fresh copy of the row (penalties may write to it);
  // the copy's own time is measured once and taken out.
  std::vector<float> row;
  const auto c0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) row = logits;
  const double copy_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c0).count() /
      double(iters);
  for (const Case& c : cases) {
    Sampler s(c.p);
    int64_t sum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      row = logits;
      sum += s.sample(row.data(), vocab);
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            double(iters) -
        copy_us;
    std::printf(
        "{\"case\": \"%s\", \"vocab\": %lld, \"us_per_sample\": %.1f, \"checksum\": %lld}\n",
        c.name, (long long)vocab, us, (long long)sum);
  }
  return 0;
}
