// The serving engine: batching never changes results, and every request
// reaches a terminal state under faults, deadlines, cancellation, KV
// pressure and shutdown — each within a wall-clock bound.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine.h"
#include "model/decoder.h"
#include "test_util.h"

using namespace tandem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Outcome {
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::None;
  std::string error;
  int completion_tokens = 0;
  int cached_tokens = 0;
  std::vector<float> logprobs;  // the chosen tokens', when asked for
  double seconds = 0;
};

// Drains a request's events; fails the test if it is not terminal in `limit_s`.
Outcome drain(RequestHandle& h, double limit_s = 20.0) {
  Outcome o;
  const double t0 = now_s();
  while (now_s() - t0 < limit_s) {
    auto e = h.next(0.05);
    if (!e) continue;
    o.ids.insert(o.ids.end(), e->ids.begin(), e->ids.end());
    for (const TokenLogprob& l : e->logprobs) o.logprobs.push_back(l.logprob);
    if (e->finish != FinishReason::None) {
      o.finish = e->finish;
      o.error = e->error;
      o.completion_tokens = e->completion_tokens;
      o.cached_tokens = e->cached_tokens;
      o.seconds = now_s() - t0;
      return o;
    }
  }
  ADD_FAILURE() << "request " << h.id() << " not terminal after " << limit_s << " s";
  return o;
}

GenerationParams greedy(int max_tokens) {
  GenerationParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Greedy ids through the plain single-sequence path (no engine).
std::vector<int32_t> solo_greedy(const Model& m, std::vector<int32_t> prompt, int n) {
  ThreadPool pool(1);
  KvPool kv_pool = single_sequence_pool(m.spec, int64_t(prompt.size()) + n, 64);
  Decoder d(m, pool, kv_pool, 64);
  SequenceKv kv;
  std::vector<float> logits(size_t(m.spec.vocab));
  run_sequence(d, prompt.data(), int64_t(prompt.size()), kv, logits.data(), false);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t id = argmax(logits.data(), m.spec.vocab);
    out.push_back(id);
    if (i + 1 < n) run_sequence(d, &id, 1, kv, logits.data(), false);
  }
  return out;
}

std::vector<int32_t> prompt_of(int i, int len) {
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back(3 + (i * 37 + j * 11) % 300);
  return p;
}

class EngineTest : public testing::Test {
 protected:
  void SetUp() override {
    unsetenv("TANDEM_FAULT");
    model_ = load_model(test::fixture_dir("gemma3_text-f32"));  // sliding + full layers
  }
  void TearDown() override { unsetenv("TANDEM_FAULT"); }
  std::unique_ptr<Engine> make(EngineConfig c = {}, const char* fault = nullptr) {
    if (fault) setenv("TANDEM_FAULT", fault, 1);
    c.threads = c.threads ? c.threads : 2;
    auto e = std::make_unique<Engine>(*model_, c);
    unsetenv("TANDEM_FAULT");
    return e;
  }
  std::unique_ptr<Model> model_;
};

TEST_F(EngineTest, GreedyMatchesTransformersReference) {
  std::ifstream f(test::fixture_dir("gemma3_text-f32") + "/reference.json");
  auto ref = nlohmann::json::parse(f);
  auto engine = make();
  auto h = engine->submit(ref["prompt"].get<std::vector<int32_t>>(), greedy(16));
  Outcome o = drain(*h);
  EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(o.ids, ref["greedy"].get<std::vector<int32_t>>());
}

TEST_F(EngineTest, ThirtyTwoConcurrentRequestsEachEqualTheirSoloOutput) {
  EngineConfig c;
  c.max_concurrent = 32;
  c.step_token_budget = 64;  // forces chunked prefill mixed with decode
  auto engine = make(c);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 32; ++i)
    handles.push_back(engine->submit(prompt_of(i, 5 + i * 3), greedy(12)));
  for (int i = 0; i < 32; ++i) {
    Outcome o = drain(*handles[size_t(i)]);
    EXPECT_EQ(o.finish, FinishReason::Length);
    EXPECT_EQ(o.ids, solo_greedy(*model_, prompt_of(i, 5 + i * 3), 12)) << "request " << i;
  }
  auto st = engine->status();
  EXPECT_EQ(st.total_requests_processed, 32u);
  EXPECT_EQ(st.total_completion_tokens, 32u * 12u);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST_F(EngineTest, KvPressureMakesRequestsWaitNeverFail) {
  EngineConfig c;
  c.max_concurrent = 6;
  // Room for about two sequences of 40 + 30 tokens in the full layers.
  c.kv_memory = size_t(6) * KvPool::sliding_blocks_per_sequence(model_->spec, 256) *
                    KvPool::block_bytes(model_->spec, AttentionKind::Sliding) +
                size_t(10) * KvPool::block_bytes(model_->spec, AttentionKind::Full);
  auto engine = make(c);
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 6; ++i) handles.push_back(engine->submit(prompt_of(i, 40), greedy(30)));
  for (int i = 0; i < 6; ++i) {
    Outcome o = drain(*handles[size_t(i)]);
    EXPECT_EQ(o.finish, FinishReason::Length) << o.error;
    EXPECT_EQ(o.ids, solo_greedy(*model_, prompt_of(i, 40), 30)) << "request " << i;
  }
}

TEST_F(EngineTest, ExceptionInAStepFailsThatStepOnlyAndTheEngineGoesOn) {
  auto engine = make({}, "step-throw@2");
  auto a = engine->submit(prompt_of(1, 8), greedy(5));
  auto b = engine->submit(prompt_of(2, 8), greedy(5));
  Outcome oa = drain(*a, 5), ob = drain(*b, 5);
  EXPECT_EQ(oa.finish, FinishReason::Error);
  EXPECT_EQ(ob.finish, FinishReason::Error);
  EXPECT_EQ(oa.error, "internal error while running the model");  // sanitized
  auto c = engine->submit(prompt_of(3, 8), greedy(5));
  Outcome oc = drain(*c, 5);
  EXPECT_EQ(oc.finish, FinishReason::Length);
  EXPECT_EQ(oc.ids, solo_greedy(*model_, prompt_of(3, 8), 5));
  auto st = engine->status();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.total_requests_failed, 2u);
  EXPECT_TRUE(st.healthy);
}

TEST_F(EngineTest, WatchdogFailsAStalledStep) {
  EngineConfig c;
  c.step_timeout_s = 0.3;
  auto engine = make(c, "step-stall@1");
  auto a = engine->submit(prompt_of(1, 8), greedy(5));
  Outcome o = drain(*a, 5);
  EXPECT_EQ(o.finish, FinishReason::Error);
  EXPECT_NE(o.error.find("watchdog"), std::string::npos) << o.error;
  EXPECT_LT(o.seconds, 2.0);
  auto st = engine->status();
  EXPECT_TRUE(st.watchdog_fired);
  // Unhealthy while the step is stuck; serving again once it returns.
  const double t0 = now_s();
  while (!engine->status().healthy && now_s() - t0 < 3.0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(engine->status().healthy);
  auto b = engine->submit(prompt_of(2, 8), greedy(4));
  EXPECT_EQ(drain(*b, 5).finish, FinishReason::Length);
}

TEST_F(EngineTest, NanLogitsFailTheRequestWithAClearError) {
  auto engine = make({}, "nan-logits@1");
  auto a = engine->submit(prompt_of(1, 8), greedy(5));
  Outcome o = drain(*a, 5);
  EXPECT_EQ(o.finish, FinishReason::Error);
  EXPECT_EQ(o.error, "the model produced NaN logits");
  EXPECT_EQ(drain(*engine->submit(prompt_of(2, 8), greedy(3)), 5).finish, FinishReason::Length);
}

// A constraint that allows nothing and may not end (a schema or a forced
// tool call the vocabulary cannot complete) fails that request with a clear
// error; the engine goes on.
TEST_F(EngineTest, AConstraintThatAllowsNoTokenFailsTheRequestClearly) {
  struct DeadEnd : TokenConstraint {
    Allowed allowed() override { return {}; }
    bool accept(int32_t) override { return false; }
  };
  struct DeadEndFactory : ConstraintFactory {
    std::unique_ptr<TokenConstraint> start() const override { return std::make_unique<DeadEnd>(); }
  };
  auto engine = make({});
  GenerationParams p = greedy(5);
  p.constraint = std::make_shared<DeadEndFactory>();
  Outcome o = drain(*engine->submit(prompt_of(1, 8), p), 5);
  EXPECT_EQ(o.finish, FinishReason::Error);
  EXPECT_NE(o.error.find("allows no token"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("forced tool call"), std::string::npos) << o.error;
  EXPECT_EQ(drain(*engine->submit(prompt_of(2, 8), greedy(3)), 5).finish, FinishReason::Length);
}

// logit_bias moves the model's logits before sampling: +100 forces a
// token at every step, -100 bans the greedy choice, and an id outside the
// vocabulary is refused at admission.
TEST_F(EngineTest, LogitBiasForcesAndBansTokens) {
  auto engine = make();
  const std::vector<int32_t> plain = solo_greedy(*model_, prompt_of(1, 8), 4);
  const int32_t forced = plain[0] == 42 ? 43 : 42;
  GenerationParams p = greedy(4);
  p.logit_bias = {{forced, 100.0f}};
  EXPECT_EQ(drain(*engine->submit(prompt_of(1, 8), p), 5).ids, std::vector<int32_t>(4, forced));
  p.logit_bias = {{plain[0], -100.0f}};
  const Outcome banned = drain(*engine->submit(prompt_of(1, 8), p), 5);
  ASSERT_EQ(banned.ids.size(), 4u);
  EXPECT_NE(banned.ids[0], plain[0]);
  for (int32_t id : banned.ids) EXPECT_NE(id, plain[0]);
  p.logit_bias = {{int32_t(model_->spec.vocab), 1.0f}};
  try {
    engine->submit(prompt_of(1, 8), p);
    ADD_FAILURE() << "admitted";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "logit_bias");
  }
  // Unbiased requests are unchanged beside them.
  EXPECT_EQ(drain(*engine->submit(prompt_of(1, 8), greedy(4)), 5).ids, plain);
}

// The prefix cache: a prompt that starts with an earlier request's tokens
// (the same prompt, or a conversation that grew by a turn) takes that
// request's KV blocks, whole blocks only and the sliding layers' too, and
// answers as a cold engine does (logprobs within 1e-4) — on every text
// architecture (sliding layers, KV-shared layers, per-layer embeddings).
class PrefixCacheTest : public testing::TestWithParam<const char*> {};

TEST_P(PrefixCacheTest, PromptsSharingABeginningReuseItsKvAndAnswerTheSame) {
  auto model = load_model(test::fixture_dir(GetParam()));
  EngineConfig config, cold_config;
  config.threads = cold_config.threads = 2;
  cold_config.prefix_cache = false;
  Engine engine(*model, config), cold(*model, cold_config);
  GenerationParams p = greedy(12);
  p.top_logprobs = 0;
  auto expect_same = [&](const Outcome& got, const Outcome& want) {
    EXPECT_EQ(got.ids, want.ids);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < got.logprobs.size(); ++i)
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4) << "token " << i;
  };
  std::vector<int32_t> prompt = prompt_of(4, 37);
  for (int32_t& id : prompt) id = 3 + id % int32_t(model->spec.vocab - 3);
  const Outcome first = drain(*engine.submit(prompt, p));
  EXPECT_EQ(first.cached_tokens, 0);
  const Outcome again = drain(*engine.submit(prompt, p));
  EXPECT_EQ(again.cached_tokens, 32);  // two whole blocks before the last prompt token
  expect_same(again, first);
  // The next turn: the prompt, the answer (its first 11 tokens were fed,
  // so 48 positions are published), then more.
  std::vector<int32_t> turn = prompt;
  turn.insert(turn.end(), first.ids.begin(), first.ids.end());
  for (int i = 0; i < 5; ++i) turn.push_back(11 + i);
  const Outcome next = drain(*engine.submit(turn, p));
  EXPECT_EQ(next.cached_tokens, 48);
  const Outcome next_cold = drain(*cold.submit(turn, p));
  EXPECT_EQ(next_cold.cached_tokens, 0);
  expect_same(next, next_cold);
  EXPECT_EQ(engine.status().total_cached_prompt_tokens, 80u);
  EXPECT_GT(engine.status().kv_blocks_cached, 0);
  EXPECT_EQ(engine.status().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(TextFixtures, PrefixCacheTest,
                         testing::Values("llama-f32", "qwen2-f32", "qwen3-f32", "gemma3_text-f32",
                                         "gemma4_text-f32", "ministral3-f32"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// Requests that arrive together with the same prompt (a request's n
// choices): the first computes it, the others wait for its blocks and take
// them, and all answer the same.
TEST_F(EngineTest, IdenticalPromptsArrivingTogetherComputeThemOnce) {
  auto engine = make();
  GenerationParams p = greedy(6);
  const std::vector<int32_t> prompt = prompt_of(9, 40);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 3; ++i) hs.push_back(engine->submit(prompt, p));
  std::vector<Outcome> outs;
  for (auto& h : hs) outs.push_back(drain(*h));
  EXPECT_EQ(outs[0].cached_tokens, 0);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(outs[size_t(i)].cached_tokens, 32) << i;
    EXPECT_EQ(outs[size_t(i)].ids, outs[0].ids) << i;
  }
  EXPECT_EQ(outs[0].ids, solo_greedy(*model_, prompt, 6));
  EXPECT_EQ(engine->status().total_prompt_tokens, 40u + 8u + 8u);
}

TEST_F(EngineTest, InjectedKvExhaustionMakesTheRequestWait) {
  auto engine = make({}, "kv-exhaust@1");
  auto a = engine->submit(prompt_of(1, 8), greedy(6));
  Outcome o = drain(*a, 5);
  EXPECT_EQ(o.finish, FinishReason::Length);
  EXPECT_EQ(o.ids, solo_greedy(*model_, prompt_of(1, 8), 6));
}

TEST_F(EngineTest, DeadlinesAndCancellationEndRequests) {
  auto engine = make();
  GenerationParams p = greedy(200);
  p.timeout_s = 1e-6;
  EXPECT_EQ(drain(*engine->submit(prompt_of(1, 8), p), 5).finish, FinishReason::Timeout);
  auto h = engine->submit(prompt_of(2, 8), greedy(200));
  auto first = h->next(5.0);
  ASSERT_TRUE(first.has_value());
  h->cancel();
  Outcome o = drain(*h, 5);
  EXPECT_EQ(o.finish, FinishReason::Cancelled);
  EXPECT_LT(o.completion_tokens, 200);
  EXPECT_EQ(engine->status().total_requests_cancelled, 1u);
}

TEST_F(EngineTest, AdmissionErrorsComeBeforeAnyWork) {
  EngineConfig c;
  c.max_concurrent = 2;
  c.step_timeout_s = 1.0;
  auto engine = make(c, "step-stall@1");
  auto expect_status = [&](std::vector<int32_t> prompt, GenerationParams p, int status,
                           const char* text) {
    try {
      engine->submit(std::move(prompt), p);
      ADD_FAILURE() << "admitted";
    } catch (const AdmissionError& e) {
      EXPECT_EQ(e.status, status) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_status({}, greedy(4), 400, "empty");
  expect_status(prompt_of(1, 300), greedy(4), 400, "context is 256 tokens");
  expect_status({1, 2, 999}, greedy(4), 400, "outside the vocabulary");
  GenerationParams with_stop = greedy(4);
  with_stop.stop = {"x"};
  expect_status(prompt_of(1, 4), with_stop, 400, "need a tokenizer");
  auto a = engine->submit(prompt_of(1, 4), greedy(4));  // stalls step 1
  auto b = engine->submit(prompt_of(2, 4), greedy(4));
  expect_status(prompt_of(3, 4), greedy(4), 503, "at capacity");
  drain(*a, 5);
  drain(*b, 5);
}

TEST_F(EngineTest, ShutdownDrainsRunningRequestsAndRefusesNewOnes) {
  auto engine = make();
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 4; ++i) hs.push_back(engine->submit(prompt_of(i, 6), greedy(20)));
  const double t0 = now_s();
  engine->shutdown(10.0);
  EXPECT_LT(now_s() - t0, 10.0);
  for (auto& h : hs) EXPECT_EQ(drain(*h, 1).finish, FinishReason::Length);
  try {
    engine->submit(prompt_of(9, 4), greedy(2));
    ADD_FAILURE() << "admitted after shutdown";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 503);
  }
}

TEST_F(EngineTest, ShutdownGracePeriodFailsWhatCannotFinish) {
  EngineConfig c;
  c.step_timeout_s = 30;
  auto engine = make(c, "step-stall@1");
  auto h = engine->submit(prompt_of(1, 6), greedy(5));
  const double t0 = now_s();
  engine->shutdown(0.2);
  EXPECT_LT(now_s() - t0, 7.0);
  EXPECT_EQ(drain(*h, 1).finish, FinishReason::Error);
}

}  // namespace

namespace {

TEST_F(EngineTest, AFinishedRequestFreesItsSlotBeforeTheClientSeesTheEnd) {
  EngineConfig c;
  c.max_concurrent = 1;
  auto engine = make(c);
  // At the limit, each request resubmitted the moment the previous one ends
  // must be admitted (no spurious 503 while the engine loop catches up).
  for (int i = 0; i < 20; ++i) {
    auto h = engine->submit(prompt_of(i, 4), greedy(1));
    EXPECT_EQ(drain(*h, 5).finish, FinishReason::Length);
  }
}

}  // namespace
