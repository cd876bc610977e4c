// Decoder invariants that parity fixtures alone do not pin: incremental
// decoding and chunked prefill (sliding-window ring buffer) give the same
// logits as one full prefill; bad ids and context overflow are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/decoder.h"
#include "test_util.h"

using namespace tandem;

namespace {

std::vector<int32_t> fixture_ids(const std::string& name) {
  std::ifstream f(test::fixture_dir(name) + "/reference.json");
  return nlohmann::json::parse(f)["ids"].get<std::vector<int32_t>>();
}

// Logits of every position, computed with prefill chunks of `chunk` tokens
// (chunk 1 = token-by-token decoding).
std::vector<float> logits_in_chunks(const Model& m, ThreadPool& pool,
                                    const std::vector<int32_t>& ids, int64_t max_chunk,
                                    int64_t step) {
  Decoder d(m, pool, max_chunk);
  const int64_t n = int64_t(ids.size()), V = m.spec.vocab;
  KvCache cache = d.new_cache(n);
  std::vector<float> out(size_t(n * V));
  for (int64_t i = 0; i < n; i += step) {
    int64_t k = std::min(step, n - i);
    d.forward(ids.data() + i, k, cache, out.data() + i * V, true);
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class DecoderConsistency : public testing::TestWithParam<std::string> {};

TEST_P(DecoderConsistency, IncrementalAndChunkedEqualFullPrefill) {
  auto model = load_model(test::fixture_dir(GetParam()));
  ThreadPool pool(2);
  auto ids = fixture_ids(GetParam());
  auto full = logits_in_chunks(*model, pool, ids, 256, 64);
  // Token by token (the decode path), and chunks of 3 and 5 that straddle the
  // sliding window (8) at every offset, with the decoder's own chunk limit
  // smaller than the call size too.
  for (auto [max_chunk, step] : {std::pair<int64_t, int64_t>{256, 1}, {3, 64}, {5, 7}, {256, 13}}) {
    auto got = logits_in_chunks(*model, pool, ids, max_chunk, step);
    EXPECT_LE(max_abs_diff(got, full), 2e-4f) << "max_chunk " << max_chunk << " step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderConsistency,
                         testing::Values("llama-f32", "qwen3-f32", "gemma3_text-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(Decoder, RejectsIdsOutsideTheVocabulary) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  ThreadPool pool(1);
  Decoder d(*model, pool);
  KvCache cache = d.new_cache(8);
  std::vector<float> logits(size_t(model->spec.vocab));
  int32_t ids[] = {5, 320};
  try {
    d.forward(ids, 2, cache, logits.data(), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("token id 320 at index 1 is outside the vocabulary [0, 320)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache.length, 0);  // nothing was written
}

TEST(Decoder, RejectsContextOverflow) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  ThreadPool pool(1);
  Decoder d(*model, pool);
  KvCache cache = d.new_cache(4);
  std::vector<float> logits(size_t(model->spec.vocab));
  int32_t ids[] = {5, 6, 7, 8, 9};
  EXPECT_THROW(d.forward(ids, 5, cache, logits.data(), false), Error);
  d.forward(ids, 4, cache, logits.data(), false);
  EXPECT_THROW(d.forward(ids, 1, cache, logits.data(), false), Error);
}

TEST(KvCache, SlidingLayersKeepOnlyTheWindowPlusAChunk) {
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));
  KvCache cache(model->spec, 1000, 16);
  EXPECT_EQ(cache.layers[0].slots, 8 + 16);  // sliding
  EXPECT_EQ(cache.layers[2].slots, 1000);    // full
}

}  // namespace
