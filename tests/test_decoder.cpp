// Decoder invariants that parity fixtures alone do not pin: incremental
// decoding and chunked prefill (sliding-window ring buffer) give the same
// logits as one full prefill; bad ids and context overflow are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/decoder.h"
#include "test_util.h"

using namespace tandem;

namespace {

std::vector<int32_t> fixture_ids(const std::string& name) {
  std::ifstream f(test::fixture_dir(name) + "/reference.json");
  return nlohmann::json::parse(f)["ids"].get<std::vector<int32_t>>();
}

// Logits of every position, fed `step` tokens per call through a decoder
// whose steps hold at most `max_step` tokens (step 1 = token-by-token decoding).
std::vector<float> logits_in_chunks(const Model& m, ThreadPool& pool,
                                    const std::vector<int32_t>& ids, int64_t max_step,
                                    int64_t step) {
  const int64_t n = int64_t(ids.size()), V = m.spec.vocab;
  KvPool kv_pool = single_sequence_pool(m.spec, n, max_step);
  Decoder d(m, pool, kv_pool, max_step);
  SequenceKv kv;
  std::vector<float> out(size_t(n * V));
  for (int64_t i = 0; i < n; i += step) {
    int64_t k = std::min(step, n - i);
    run_sequence(d, ids.data() + i, k, kv, out.data() + i * V, true);
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
  auto full = logits_in_chunks(*model, pool, ids, 64, 64);
  // Token by token (the decode path), and chunks of 3 and 5 that straddle the
  // sliding window (8) at every offset, with the decoder's own chunk limit
  // smaller than the call size too.
  for (auto [max_chunk, step] : {std::pair<int64_t, int64_t>{256, 1}, {3, 64}, {5, 7}, {256, 13}}) {
    auto got = logits_in_chunks(*model, pool, ids, max_chunk, step);
    EXPECT_LE(max_abs_diff(got, full), 2e-4f) << "max_chunk " << max_chunk << " step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderConsistency,
                         testing::Values("llama-f32", "qwen3-f32", "gemma3_text-f32",
                                         "gemma4_text-f32", "ministral3-f32"),
                         [](const auto& info) {
                           return tandem::test::fixture_param_name(info.param);
                         });

TEST(Decoder, RejectsIdsOutsideTheVocabulary) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  ThreadPool pool(1);
  KvPool kv_pool = single_sequence_pool(model->spec, 8, 8);
  Decoder d(*model, pool, kv_pool, 8);
  SequenceKv kv;
  std::vector<float> logits(size_t(model->spec.vocab));
  int32_t ids[] = {5, 320};
  try {
    run_sequence(d, ids, 2, kv, logits.data(), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("token id 320 at index 1 is outside the vocabulary [0, 320)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(kv.length, 0);  // nothing was written
}

TEST(Decoder, RejectsContextOverflow) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  ThreadPool pool(1);
  KvPool kv_pool = single_sequence_pool(model->spec, 16, 8);  // one block
  Decoder d(*model, pool, kv_pool, 8);
  SequenceKv kv;
  std::vector<float> logits(size_t(model->spec.vocab));
  std::vector<int32_t> ids(17, 5);
  EXPECT_THROW(run_sequence(d, ids.data(), 17, kv, logits.data(), false), Error);
  kv_release(kv_pool, kv);
  SequenceKv fresh;
  run_sequence(d, ids.data(), 16, fresh, logits.data(), false);
  EXPECT_THROW(run_sequence(d, ids.data(), 1, fresh, logits.data(), false), Error);
}

TEST(Decoder, BatchedStepEqualsEachSequenceAlone) {
  // Three sequences of different lengths in one step (one decoding, two
  // prefilling) give the logits each gets alone.
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));
  const ModelSpec& s = model->spec;
  ThreadPool pool(2);
  auto ids = fixture_ids("gemma3_text-f32");
  KvPool kv_pool(s, 64, 64);
  Decoder d(*model, pool, kv_pool, 64);
  std::vector<SequenceKv> kv(3);
  std::vector<std::vector<float>> got(3, std::vector<float>(size_t(s.vocab)));
  // Sequence 0 has a 20-token history and decodes one token; 1 and 2 prefill.
  std::vector<float> scratch(size_t(s.vocab));
  run_sequence(d, ids.data(), 20, kv[0], scratch.data(), false);
  const int64_t lens[3] = {1, 11, 30};
  const int32_t* starts[3] = {ids.data() + 20, ids.data() + 3, ids.data() + 30};
  std::vector<SeqStep> batch;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(kv_reserve(kv_pool, s, kv[i], kv[i].length + lens[i]));
    batch.push_back({starts[i], lens[i], &kv[i], got[i].data(), false});
  }
  d.step(batch);
  // Alone: sequence 0 as 21 tokens, the others as their own prompts.
  auto alone = [&](const int32_t* p, int64_t n) {
    auto all = logits_in_chunks(*model, pool, std::vector<int32_t>(p, p + n), 64, 64);
    return std::vector<float>(all.end() - s.vocab, all.end());
  };
  EXPECT_LE(max_abs_diff(got[0], alone(ids.data(), 21)), 1e-4f);
  EXPECT_LE(max_abs_diff(got[1], alone(starts[1], 11)), 1e-4f);
  EXPECT_LE(max_abs_diff(got[2], alone(starts[2], 30)), 1e-4f);
}

TEST(KvPool, SlidingLayersHoldOnlyTheWindow) {
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));  // window 8
  const ModelSpec& s = model->spec;
  ThreadPool pool(1);
  KvPool kv_pool = single_sequence_pool(s, 64, 4);
  EXPECT_EQ(kv_pool.total(AttentionKind::Full), 4);
  EXPECT_EQ(kv_pool.total(AttentionKind::Sliding), KvPool::sliding_blocks_per_sequence(s, 4));
  Decoder d(*model, pool, kv_pool, 4);
  SequenceKv kv;
  std::vector<float> logits(size_t(s.vocab));
  auto ids = fixture_ids("gemma3_text-f32");
  for (int i = 0; i < 64; ++i) {
    run_sequence(d, ids.data() + i, 1, kv, logits.data(), false);
    EXPECT_LE(int64_t(kv.sliding.size()), 2) << "after " << i + 1 << " tokens";
  }
  EXPECT_EQ(kv.full.size(), 4u);
  kv_release(kv_pool, kv);
  EXPECT_EQ(kv_pool.free_count(AttentionKind::Full), 4);
  EXPECT_EQ(kv_pool.free_count(AttentionKind::Sliding), kv_pool.total(AttentionKind::Sliding));
}

// The prefix cache's bookkeeping: published blocks outlive their holders as
// cached blocks (still counted free), lookup() finds them by key and checks
// the tokens, acquire() takes them out of the cache, allocate() hands out
// never-published blocks first and then evicts the least recently released.
TEST(KvPool, PublishedBlocksAreCachedSharedAndEvictedOldestFirst) {
  auto model = load_model(test::fixture_dir("llama-f32"));  // full layers only
  const ModelSpec& s = model->spec;
  const AttentionKind F = AttentionKind::Full;
  KvPool pool(s, 4, 0);
  std::vector<int32_t> tokens(48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(7 * i + 3);
  const BlockKey k0 = block_key(0, tokens.data());
  const BlockKey k1 = block_key(k0.hash, tokens.data() + 16);
  const BlockKey k2 = block_key(k1.hash, tokens.data() + 32);
  EXPECT_NE(k0.hash, k1.hash);
  EXPECT_EQ(block_key(0, tokens.data()).hash, k0.hash);  // a function of the tokens only
  BlockKey other = k1;
  other.tokens[5] += 1;  // same hash claimed, different tokens: not a match
  const int32_t a = pool.allocate(F), b = pool.allocate(F), c = pool.allocate(F);
  pool.publish(F, a, k0);
  pool.publish(F, b, k1);
  pool.publish(F, c, k1);  // the key is taken: c stays unpublished
  EXPECT_EQ(pool.lookup(F, k0), a);
  EXPECT_EQ(pool.lookup(F, k1), b);
  EXPECT_EQ(pool.lookup(F, other), -1);
  EXPECT_EQ(pool.lookup(F, k2), -1);
  EXPECT_EQ(pool.free_count(F), 1);
  pool.release(F, b);  // cached first: the oldest
  pool.release(F, a);
  pool.release(F, c);  // unpublished: plainly free
  EXPECT_EQ(pool.free_count(F), 4);
  EXPECT_EQ(pool.cached_count(F), 2);
  pool.acquire(F, a);  // shared again: out of the cache
  EXPECT_EQ(pool.cached_count(F), 1);
  EXPECT_EQ(pool.free_count(F), 3);
  // Two never-published blocks go first, then b (the only cached one) is evicted.
  const int32_t d = pool.allocate(F), e = pool.allocate(F);
  EXPECT_NE(d, b);
  EXPECT_NE(e, b);
  EXPECT_EQ(pool.lookup(F, k1), b);
  EXPECT_EQ(pool.allocate(F), b);
  EXPECT_EQ(pool.lookup(F, k1), -1);
  EXPECT_EQ(pool.allocate(F), -1);
  EXPECT_EQ(pool.lookup(F, k0), a);  // held, still published
  pool.release(F, a);
  EXPECT_EQ(pool.cached_count(F), 1);
  const std::string twice = test::error_of([&] { pool.release(F, a); });
  EXPECT_NE(twice.find("not held"), std::string::npos) << twice;
}

// kv_take_prefix: whole blocks only, at least one token left to compute, and
// on a model with sliding layers only as far as the window's sliding blocks
// are cached too.
TEST(KvPool, TakingAPrefixNeedsItsFullAndSlidingBlocks) {
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));  // window 8
  const ModelSpec& s = model->spec;
  KvPool pool(s, 8, 8);
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(5 * i + 1);
  SequenceKv first;
  ASSERT_TRUE(kv_reserve(pool, s, first, 48));
  first.length = 48;
  kv_publish(pool, s, first, PrefixTokens{tokens});
  EXPECT_EQ(first.hashes.size(), 3u);
  kv_trim_sliding(pool, s, first);  // sliding blocks 0 and 1: released, cached
  kv_release(pool, first);
  // 49 tokens: three whole blocks before the last token.
  SequenceKv second;
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 49);
  EXPECT_EQ(kv_take_prefix(pool, s, second, PrefixTokens{prompt}), 48);
  EXPECT_EQ(second.full.size(), 3u);
  EXPECT_EQ(second.sliding_first, (48 - 8 + 1) / 16);
  EXPECT_EQ(second.sliding.size(), 1u);
  kv_release(pool, second);
  // 48 tokens: the last one must be computed, so two blocks.
  prompt.pop_back();
  EXPECT_EQ(kv_take_prefix(pool, s, second, PrefixTokens{prompt}), 32);
  kv_release(pool, second);
  // A different token in block 1: only block 0 matches.
  prompt[20] += 1;
  EXPECT_EQ(kv_take_prefix(pool, s, second, PrefixTokens{prompt}), 16);
  kv_release(pool, second);
  // Every sliding block evicted: nothing can be taken.
  std::vector<int32_t> held;
  for (int32_t b; (b = pool.allocate(AttentionKind::Sliding)) >= 0;) held.push_back(b);
  EXPECT_EQ(kv_take_prefix(pool, s, second, PrefixTokens{tokens}), 0);
  EXPECT_TRUE(second.full.empty());
  for (int32_t b : held) pool.release(AttentionKind::Sliding, b);
}

TEST(KvPool, RowTypesSetTheBlockSizeAndHostRowsAreF32) {
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));
  const ModelSpec& s = model->spec;
  for (AttentionKind kind : {AttentionKind::Full, AttentionKind::Sliding})
    EXPECT_EQ(KvPool::block_bytes(s, kind, DType::BF16) * 2, KvPool::block_bytes(s, kind));
  EXPECT_EQ(KvPool(s, 2, 2, /*host_storage=*/false, DType::BF16).row_dtype(), DType::BF16);
  const std::string host = test::error_of([&] { KvPool(s, 2, 2, true, DType::BF16); });
  EXPECT_NE(host.find("--kv-cache-dtype bf16 needs --device cuda"), std::string::npos) << host;
  const std::string f16 = test::error_of([&] { KvPool(s, 2, 2, false, DType::F16); });
  EXPECT_NE(f16.find("f32 or bf16"), std::string::npos) << f16;
}

// The oracle of bf16 KV rows: every row the decoder writes is a bf16 value,
// and the logits move (by about 2e-2 x std on this fixture) but stay close.
TEST(Decoder, RoundingKvRowsToBf16KeepsOnlyBf16Values) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  const ModelSpec& s = model->spec;
  const std::vector<int32_t> ids = fixture_ids("llama-f32");
  const int64_t n = int64_t(ids.size()), V = s.vocab;
  ThreadPool pool(2);
  std::vector<float> logits[2];
  for (int round = 0; round < 2; ++round) {
    KvPool kv_pool = single_sequence_pool(s, n, Decoder::kDefaultStepTokens);
    Decoder d(*model, pool, kv_pool);
    d.round_kv_rows_to_bf16(round == 1);
    SequenceKv kv;
    logits[round].resize(size_t(n * V));
    run_sequence(d, ids.data(), n, kv, logits[round].data(), true);
    size_t not_bf16 = 0;
    const int64_t row = s.layer[0].kv_dim();
    for (int64_t p = 0; p < n; ++p)
      for (const float* r : {kv_pool.keys(0, kv.full[size_t(p / KvPool::kBlockSize)]),
                             kv_pool.values(0, kv.full[size_t(p / KvPool::kBlockSize)])})
        for (int64_t j = 0; j < row; ++j) {
          const float x = r[(p % KvPool::kBlockSize) * row + j];
          not_bf16 += bf16_to_f32(f32_to_bf16(x)) != x;
        }
    if (round == 1)
      EXPECT_EQ(not_bf16, 0u);
    else
      EXPECT_GT(not_bf16, 0u);  // f32 rows keep f32 values
  }
  float scale = 0;
  for (float x : logits[0]) scale = std::max(scale, std::fabs(x));
  const float moved = max_abs_diff(logits[0], logits[1]);
  EXPECT_GT(moved, 0.f);
  EXPECT_LT(moved, 0.05f * scale);
}

TEST(KvPool, ReserveIsAllOrNothing) {
  auto model = load_model(test::fixture_dir("llama-f32"));
  KvPool kv_pool(model->spec, 3, 0);
  SequenceKv a, b;
  ASSERT_TRUE(kv_reserve(kv_pool, model->spec, a, 40));  // 3 blocks
  EXPECT_FALSE(kv_reserve(kv_pool, model->spec, b, 1));
  EXPECT_TRUE(b.full.empty());
  kv_release(kv_pool, a);
  EXPECT_TRUE(kv_reserve(kv_pool, model->spec, b, 1));
}

}  // namespace

namespace {

TEST(Decoder, ImageRunsAttendBidirectionallyAndAreNeverSplit) {
  auto model = load_model(test::fixture_dir("gemma3_text-f32"));
  const ModelSpec& s = model->spec;
  ThreadPool pool(2);
  auto all = fixture_ids("gemma3_text-f32");
  std::vector<int32_t> ids(all.begin(), all.begin() + 20);
  std::vector<int64_t> key_end(20);
  for (int64_t i = 0; i < 20; ++i) key_end[size_t(i)] = i + 1;
  for (int64_t i = 5; i < 10; ++i) key_end[size_t(i)] = 10;  // one "image" at positions 5..9
  auto run = [&](int64_t max_step, const int64_t* ends) {
    KvPool kv_pool = single_sequence_pool(s, 20, max_step);
    Decoder d(*model, pool, kv_pool, max_step);
    SequenceKv kv;
    std::vector<float> out(size_t(20 * s.vocab));
    run_sequence(d, ids.data(), 20, kv, out.data(), true, nullptr, ends);
    return out;
  };
  auto whole = run(64, key_end.data());
  auto stepped = run(8, key_end.data());  // 8-token steps must move their boundary off the run
  EXPECT_LE(max_abs_diff(whole, stepped), 1e-4f);
  auto causal = run(64, nullptr);
  auto row = [&](const std::vector<float>& v, int64_t t) {
    return std::vector<float>(v.begin() + t * s.vocab, v.begin() + (t + 1) * s.vocab);
  };
  EXPECT_GT(max_abs_diff(row(whole, 5), row(causal, 5)), 1e-3f);  // saw the later image tokens
  EXPECT_LE(max_abs_diff(row(whole, 4), row(causal, 4)), 1e-5f);  // text before the image did not
  // A run longer than a step cannot be placed.
  EXPECT_THROW(run(4, key_end.data()), Error);
}

}  // namespace
