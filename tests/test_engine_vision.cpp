// The engine's two lanes on the tiny multimodal checkpoints: image requests
// (vision lane) against transformers' logits, text requests on the same
// checkpoint never touching the encoder, and an encoder failure confined to
// its request.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/image_prompt.h"
#include "model/kv_pool.h"
#include "model/vision_tower.h"
#include "test_util.h"

using namespace tandem;
using nlohmann::json;

namespace {

struct Result {
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> first_top;  // the first token's alternatives
  FinishReason finish = FinishReason::None;
  std::string error;
  int cached_tokens = 0;
};

Result drain(RequestHandle& h, double limit_s = 30.0) {
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    auto e = h.next(0.05);
    if (!e) continue;
    if (r.first_top.empty() && !e->top.empty()) r.first_top = e->top[0];
    r.ids.insert(r.ids.end(), e->ids.begin(), e->ids.end());
    if (e->finish != FinishReason::None) {
      r.finish = e->finish;
      r.error = e->error;
      r.cached_tokens = e->cached_tokens;
      return r;
    }
  }
  ADD_FAILURE() << "request " << h.id() << " not terminal after " << limit_s << " s";
  return r;
}

GenerationParams params(int max_tokens, int top_logprobs = -1) {
  GenerationParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.top_logprobs = top_logprobs;
  return p;
}

std::string vision_dir(const std::string& family) {
  return test::vision_fixture_dir(family);
}

json reference(const std::string& family) {
  std::ifstream f(vision_dir(family) + "/reference.json");
  return json::parse(f);
}

// log_softmax of a reference logits row.
std::vector<double> log_softmax(const json& row) {
  std::vector<double> v = row.get<std::vector<double>>();
  double mx = v[0], sum = 0;
  for (double x : v) mx = std::max(mx, x);
  for (double x : v) sum += std::exp(x - mx);
  for (double& x : v) x = x - mx - std::log(sum);
  return v;
}

// The engine's top-5 first-token logprobs equal transformers' last-position
// log-softmax.
void expect_top_matches(const Result& r, const json& logits_row, const std::string& what) {
  const std::vector<double> want = log_softmax(logits_row);
  ASSERT_EQ(r.first_top.size(), 5u) << what;
  for (const TokenLogprob& t : r.first_top)
    EXPECT_NEAR(t.logprob, want[size_t(t.id)], 2e-3) << what << " token " << t.id;
  size_t best = 0;
  for (size_t v = 1; v < want.size(); ++v)
    if (want[v] > want[best]) best = v;
  EXPECT_EQ(r.first_top[0].id, int32_t(best)) << what;
}

class EngineVision : public testing::TestWithParam<const char*> {
 public:
  void SetUp() override {
    unsetenv("TANDEM_FAULT");
    family_ = GetParam();
    model_ = load_model(test::vision_model_dir(family_));
    tower_ = VisionTower::load(*model_);
  }
  std::unique_ptr<Engine> make(bool with_tower, const char* fault = nullptr,
                               bool prefix_cache = true) {
    if (fault) setenv("TANDEM_FAULT", fault, 1);
    EngineConfig c;
    c.threads = 2;
    c.prefix_cache = prefix_cache;
    auto e = std::make_unique<Engine>(*model_, c, nullptr, with_tower ? tower_.get() : nullptr);
    unsetenv("TANDEM_FAULT");
    return e;
  }
  std::vector<PreparedImage> images(const json& which) {
    std::vector<PreparedImage> out;
    for (const json& k : which)
      out.push_back(tower_->prepare(read_image_file(vision_dir(family_) + "/input_" +
                                                    std::to_string(k.get<int>()) + ".png")));
    return out;
  }
  std::string family_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<VisionTower> tower_;
};

TEST_P(EngineVision, ImageRequestsMatchTransformers) {
  auto engine = make(true);
  const json ref = reference(family_);
  for (const json& c : ref["cases"]) {
    auto h =
        engine->submit(c["ids"].get<std::vector<int32_t>>(), params(2, 5), images(c["images"]));
    const Result r = drain(*h);
    ASSERT_EQ(r.finish, FinishReason::Length) << c["name"] << ": " << r.error;
    expect_top_matches(r, c["logits"].back(), family_ + " " + c["name"].get<std::string>());
  }
  const EngineStatus st = engine->status();
  EXPECT_EQ(st.vision_lane_requests, 2u);
  EXPECT_EQ(st.text_lane_requests, 1u);
  EXPECT_EQ(st.images_processed, 3u);
  EXPECT_GE(st.vision_encoder_calls, 1u);
}

TEST_P(EngineVision, TextRequestsRunTheBackboneAloneOnBothConfigurations) {
  // The text case of the reference (transformers' multimodal model, no
  // image) through an engine with the tower and one without: the same
  // logprobs, and the encoder is never called.
  const json ref = reference(family_);
  const json& text = ref["cases"][0];
  ASSERT_EQ(text["name"], "text");
  std::vector<std::vector<TokenLogprob>> tops;
  std::vector<std::vector<int32_t>> outs;
  for (bool with_tower : {true, false}) {
    auto engine = make(with_tower);
    auto h = engine->submit(text["ids"].get<std::vector<int32_t>>(), params(8, 5));
    const Result r = drain(*h);
    ASSERT_EQ(r.finish, FinishReason::Length) << r.error;
    expect_top_matches(r, text["logits"].back(), family_ + " text");
    tops.push_back(r.first_top);
    outs.push_back(r.ids);
    const EngineStatus st = engine->status();
    EXPECT_EQ(st.vision_encoder_calls, 0u);
    EXPECT_EQ(st.images_processed, 0u);
    EXPECT_EQ(st.text_lane_requests, 1u);
    EXPECT_EQ(st.vision_lane_requests, 0u);
  }
  EXPECT_EQ(outs[0], outs[1]);
  for (size_t i = 0; i < tops[0].size(); ++i) {
    EXPECT_EQ(tops[0][i].id, tops[1][i].id);
    EXPECT_EQ(tops[0][i].logprob, tops[1][i].logprob);  // bit-identical: one code path
  }
}

TEST_P(EngineVision, AnEncoderExceptionFailsOnlyItsRequest) {
  // The first image given to the encoder throws: its request fails; another
  // image request and a text request, in flight at the same time, finish.
  auto engine = make(true, "vision-throw@1");
  const json ref = reference(family_);
  const json &text = ref["cases"][0], &one = ref["cases"][1];
  auto a = engine->submit(one["ids"].get<std::vector<int32_t>>(), params(4), images(one["images"]));
  auto b = engine->submit(one["ids"].get<std::vector<int32_t>>(), params(4), images(one["images"]));
  auto c = engine->submit(text["ids"].get<std::vector<int32_t>>(), params(4));
  const Result ra = drain(*a), rb = drain(*b), rc = drain(*c);
  EXPECT_EQ(ra.finish, FinishReason::Error);
  EXPECT_EQ(ra.error, "internal error in the vision encoder");
  EXPECT_EQ(rb.finish, FinishReason::Length) << rb.error;
  EXPECT_EQ(rc.finish, FinishReason::Length) << rc.error;
  EXPECT_EQ(rb.ids.size(), 4u);
  // The engine keeps serving image requests.
  auto d = engine->submit(one["ids"].get<std::vector<int32_t>>(), params(2), images(one["images"]));
  EXPECT_EQ(drain(*d).finish, FinishReason::Length);
  const EngineStatus st = engine->status();
  EXPECT_EQ(st.images_processed, 2u);
  EXPECT_EQ(st.total_requests_failed, 1u);
}

TEST_P(EngineVision, ConcurrentImageRequestsEqualTheirSoloOutputs) {
  const json ref = reference(family_);
  const json& two = ref["cases"][2];
  const auto ids = two["ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> solo;
  {
    auto engine = make(true);
    auto h = engine->submit(ids, params(6), images(two["images"]));
    solo = drain(*h).ids;
  }
  auto engine = make(true);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 6; ++i) hs.push_back(engine->submit(ids, params(6), images(two["images"])));
  for (auto& h : hs) {
    const Result r = drain(*h);
    ASSERT_EQ(r.finish, FinishReason::Length) << r.error;
    EXPECT_EQ(r.ids, solo);
  }
  // Requests that arrive after an earlier one's prompt is cached skip the
  // encoder (the prefix cache); the first encodes its two images.
  const EngineStatus st = engine->status();
  EXPECT_GE(st.images_processed, 2u);
  EXPECT_LE(st.images_processed, 12u);
  EXPECT_LE(st.vision_encoder_calls, 12u);
  std::printf("[vision lane] %s: %llu of 12 images encoded, in %llu encoder batches\n",
              family_.c_str(), (unsigned long long)st.images_processed,
              (unsigned long long)st.vision_encoder_calls);
}

// Two answers to the same request agree: the same ids, the first token's
// alternatives within 1e-4 (the prefix cache's reused rows were computed in
// other steps).
void expect_same_answer(const Result& got, const Result& want, const char* what) {
  ASSERT_EQ(got.finish, FinishReason::Length) << what << ": " << got.error;
  EXPECT_EQ(got.ids, want.ids) << what;
  ASSERT_EQ(got.first_top.size(), want.first_top.size()) << what;
  for (size_t i = 0; i < got.first_top.size(); ++i) {
    EXPECT_EQ(got.first_top[i].id, want.first_top[i].id) << what;
    EXPECT_NEAR(got.first_top[i].logprob, want.first_top[i].logprob, 1e-4) << what;
  }
}

// A conversation's next turn: the one-image case answered by `engine` (12
// tokens), its answer, then `more` tokens of the answer again.
std::vector<int32_t> next_turn(EngineVision& t, Engine& engine, const json& one, int more) {
  const auto ids = one["ids"].get<std::vector<int32_t>>();
  const Result first = drain(*engine.submit(ids, params(12), t.images(one["images"])));
  EXPECT_EQ(first.finish, FinishReason::Length) << first.error;
  std::vector<int32_t> turn = ids;
  turn.insert(turn.end(), first.ids.begin(), first.ids.end());
  for (int i = 0; i < more && !first.ids.empty(); ++i)
    turn.push_back(first.ids[size_t(i) % first.ids.size()]);
  return turn;
}

// The prefix cache over image prompts: a conversation's next turn, which
// repeats the image, takes the cached blocks holding the image's soft tokens
// and does not encode it again; another image with the same text matches
// only before the image. Both answer as a cold engine does.
TEST_P(EngineVision, TheNextTurnReusesTheImagesKvWithoutEncodingItAgain) {
  const json ref = reference(family_);
  const json& one = ref["cases"][1];
  auto engine = make(true);
  auto cold = make(true, nullptr, /*prefix_cache=*/false);
  const std::vector<int32_t> turn = next_turn(*this, *engine, one, 20);
  const Result next = drain(*engine->submit(turn, params(4, 5), images(one["images"])));
  const Result next_cold = drain(*cold->submit(turn, params(4, 5), images(one["images"])));
  EXPECT_GT(next.cached_tokens, 0);
  EXPECT_EQ(next_cold.cached_tokens, 0);
  expect_same_answer(next, next_cold, "the same image");
  EXPECT_EQ(engine->status().images_processed, 1u);  // the next turn's image was not encoded
  EXPECT_EQ(cold->status().images_processed, 1u);
  // The same text with other pixels: nothing from the image on is reused.
  std::vector<PreparedImage> other = images(one["images"]);
  other[0].pixels[other[0].pixels.size() / 2] += 0.5f;
  std::vector<PreparedImage> other_again = other;
  const Result changed = drain(*engine->submit(turn, params(4, 5), std::move(other)));
  const Result changed_cold = drain(*cold->submit(turn, params(4, 5), std::move(other_again)));
  EXPECT_LT(changed.cached_tokens, next.cached_tokens);
  expect_same_answer(changed, changed_cold, "another image");
  EXPECT_EQ(engine->status().images_processed, 2u);
}

// Another question about the same image: the prompts agree up to just past
// the image, so the cache serves every whole block before the first
// different token — ending inside the image's run where a block boundary
// falls there (Gemma 4's fixture: blocks [0, 64) of a run [4, 68), which
// also the same prompt again now reuses). The image is encoded again for the
// rest of its run, and both answers are a cold engine's.
TEST_P(EngineVision, AnotherQuestionAboutTheSameImageReusesTheBlocksUpToTheQuestion) {
  constexpr int64_t B = KvPool::kBlockSize;
  const json ref = reference(family_);
  const json& one = ref["cases"][1];
  const auto ids = one["ids"].get<std::vector<int32_t>>();
  const int64_t len = int64_t(ids.size());
  const int64_t image_end =
      image_token_ends(ids, images(one["images"]), tower_->ids().placeholder).back();
  ASSERT_LT(image_end + 1, len);
  // The question: the first token after the image's closing marker changed.
  std::vector<int32_t> other = ids;
  const int64_t diff = image_end + 1;
  other[size_t(diff)] = ids[size_t(diff)] == ids[size_t(len - 1)] ? ids[0] : ids[size_t(len - 1)];
  ASSERT_NE(other[size_t(diff)], ids[size_t(diff)]);
  auto engine = make(true);
  auto cold = make(true, nullptr, /*prefix_cache=*/false);
  const Result first = drain(*engine->submit(ids, params(4, 5), images(one["images"])));
  ASSERT_EQ(first.finish, FinishReason::Length) << first.error;
  const Result again = drain(*engine->submit(ids, params(4, 5), images(one["images"])));
  EXPECT_EQ(again.cached_tokens, (len - 1) / B * B);
  expect_same_answer(again, first, "the same prompt again");
  const Result asked = drain(*engine->submit(other, params(4, 5), images(one["images"])));
  const Result asked_cold = drain(*cold->submit(other, params(4, 5), images(one["images"])));
  EXPECT_EQ(asked.cached_tokens, std::min(diff, len - 1) / B * B);
  expect_same_answer(asked, asked_cold, "another question about the image");
  std::printf(
      "[vision cache] %s: image run ends at %lld of %lld; the same prompt took %d cached "
      "tokens, another question %d\n",
      family_.c_str(), (long long)image_end, (long long)len, again.cached_tokens,
      asked.cached_tokens);
}

// The vision lane skipped the image (its blocks were cached), then the
// cache lost them before the request took them: the image is encoded after
// all, and the answer is a cold engine's.
TEST_P(EngineVision, AnImageSkippedForTheCacheIsEncodedWhenTheCacheLosesIt) {
  const json ref = reference(family_);
  const json& one = ref["cases"][1];
  auto engine = make(true, "cache-drop@2");
  auto cold = make(true, nullptr, /*prefix_cache=*/false);
  const std::vector<int32_t> turn = next_turn(*this, *engine, one, 0);
  const Result next = drain(*engine->submit(turn, params(4, 5), images(one["images"])));
  const Result want = drain(*cold->submit(turn, params(4, 5), images(one["images"])));
  EXPECT_EQ(next.cached_tokens, 0);
  expect_same_answer(next, want, "after the cache dropped the image's blocks");
  EXPECT_EQ(engine->status().images_processed, 2u);
}

TEST_P(EngineVision, ImagesAreRefusedWithoutATowerOrWithWrongPlaceholders) {
  const json ref = reference(family_);
  const json& one = ref["cases"][1];
  auto no_tower = make(false);
  try {
    no_tower->submit(one["ids"].get<std::vector<int32_t>>(), params(2), images(one["images"]));
    FAIL() << "images accepted without a tower";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("without a vision tower"), std::string::npos);
  }
  auto engine = make(true);
  try {
    engine->submit(ref["cases"][0]["ids"].get<std::vector<int32_t>>(), params(2),
                   images(one["images"]));
    FAIL() << "an image without placeholders accepted";
  } catch (const AdmissionError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("image placeholders"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineVision, testing::Values("gemma3", "gemma4", "mistral3"));

}  // namespace

namespace {

TEST(ImageRuns, PrefillChunksNeverCutAnImageRun) {
  // Runs [4, 10) and [12, 20).
  const std::vector<std::pair<int64_t, int64_t>> runs = {{4, 10}, {12, 20}};
  EXPECT_EQ(chunk_outside_runs(runs, 0, 4), 4);    // ends where a run begins
  EXPECT_EQ(chunk_outside_runs(runs, 0, 6), 4);    // would cut [4, 10): stop before it
  EXPECT_EQ(chunk_outside_runs(runs, 4, 2), 6);    // starts a run: the whole run
  EXPECT_EQ(chunk_outside_runs(runs, 4, 6), 6);    // exactly the run
  EXPECT_EQ(chunk_outside_runs(runs, 4, 10), 8);   // run, text, then stop before [12, 20)
  EXPECT_EQ(chunk_outside_runs(runs, 10, 3), 2);   // text, then stop before [12, 20)
  EXPECT_EQ(chunk_outside_runs(runs, 12, 3), 8);   // a run longer than the budget: whole
  EXPECT_EQ(chunk_outside_runs(runs, 0, 25), 25);  // covers both runs
}

}  // namespace

namespace {

class VisionWeights : public testing::TestWithParam<const char*> {};

TEST_P(VisionWeights, TextUseNeverViewsAVisionTensor) {
  // What --text-only relies on: loading the model and serving text views
  // no tensor of the tower or projector; loading the tower does.
  auto model = load_model(test::vision_model_dir(GetParam()));
  {
    EngineConfig c;
    c.threads = 1;
    Engine engine(*model, c);
    auto h = engine.submit({2, 17, 29}, params(2));
    EXPECT_EQ(drain(*h).finish, FinishReason::Length);
  }
  size_t vision_viewed = 0;
  for (const std::string& name : model->checkpoint.viewed())
    vision_viewed += is_vision_tensor(name);
  EXPECT_EQ(vision_viewed, 0u);
  EXPECT_GT(VisionTower::checkpoint_bytes(*model), 0u);
  auto tower = VisionTower::load(*model);
  for (const std::string& name : model->checkpoint.viewed())
    vision_viewed += is_vision_tensor(name);
  EXPECT_GT(vision_viewed, 0u);
  // Whatever is still unviewed belongs to the vision side (Gemma 3
  // checkpoints carry SigLIP's pooling head, which Gemma 3 does not use).
  const auto viewed = model->checkpoint.viewed();
  for (const std::string& name : model->checkpoint.names())
    if (!std::binary_search(viewed.begin(), viewed.end(), name)) {
      EXPECT_TRUE(is_vision_tensor(name)) << name;
    }
}

INSTANTIATE_TEST_SUITE_P(Families, VisionWeights, testing::Values("gemma3", "gemma4", "mistral3"));

}  // namespace
