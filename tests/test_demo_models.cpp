// The trained demo models (models/*-demo, tools/train/train_demo.py) against
// transformers: tandem's chat prompt ids equal the processor's for every
// golden case (text and image), and tandem's greedy answer through the server
// equals transformers' greedy answer word for word
// (tests/fixtures/demo/<model>.json, written by the training run on the GPU
// machine). The coherence gate (ctest -L coherence) checks the answers are
// right; this checks they are the same model.
#include <gtest/gtest.h>

#include <fstream>

#include "model/model.h"
#include "model/vision_tower.h"
#include "server/chat_images.h"
#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::string model_dir(const std::string& name) {
  return "models/" + name;
}

// Each golden case as OpenAI messages: text cases carry theirs; image cases
// take their image (a data URL) and question from coherence/demo-vision.json.
std::vector<std::pair<json, json>> cases_with_messages(const std::string& name) {
  const json golden = read_json("tests/fixtures/demo/" + name + ".json");
  const json vision = read_json("coherence/demo-vision.json");
  std::vector<std::pair<json, json>> out;
  for (const json& c : golden["cases"]) {
    json messages = c.value("messages", json());
    if (messages.is_null())
      for (const json& v : vision["cases"])
        if (v["id"] == c["id"]) messages = v["messages"];
    EXPECT_FALSE(messages.is_null()) << c["id"];
    if (!messages.is_null()) out.emplace_back(c, messages);
  }
  return out;
}

class DemoModel : public testing::TestWithParam<const char*> {};

TEST_P(DemoModel, PromptIdsEqualTheProcessors) {
  const std::string name = GetParam(), dir = model_dir(name);
  auto model = load_model(dir);
  auto tower = VisionTower::load(*model);
  auto text = server::ModelText::load(dir);
  ASSERT_TRUE(text && text->has_chat_template());
  int images = 0;
  for (const auto& [c, messages] : cases_with_messages(name)) {
    server::ChatImageInputs in = server::load_chat_images(messages, *tower, *text, {});
    const auto ids =
        text->chat_prompt(messages, nullptr, nullptr, in.images.empty() ? nullptr : &in.text);
    EXPECT_EQ(ids, c["prompt_ids"].get<std::vector<int32_t>>()) << name << " " << c["id"];
    images += int(in.images.size());
  }
  EXPECT_EQ(images, 7);
}

TEST_P(DemoModel, GreedyAnswersEqualTransformers) {
  const std::string name = GetParam();
  ChildServer srv({model_dir(name), "--threads", "1"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  for (const auto& [c, messages] : cases_with_messages(name)) {
    json body = {{"messages", messages}, {"max_tokens", 24}, {"temperature", 0}};
    auto r = post_json(srv.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], c["transformers_answer"])
        << name << " " << c["id"];
  }
}

TEST(DemoModel, ServeWithNoModelServesTheBuiltInDemo) {
  // The demo is linked into the binary and written to the cache on first use.
  TempDir cache;
  ChildServer srv({"--threads", "1"}, {"TANDEM_CACHE=" + cache.path()});
  ASSERT_TRUE(srv.ready()) << srv.log();
  EXPECT_NE(srv.log().find("built-in demo model"), std::string::npos) << srv.log();
  const json models = http_get(srv.port(), "/v1/models").body;
  EXPECT_EQ(models["data"][0]["id"], "gemma3-demo");
  json body = {{"messages", {{{"role", "user"}, {"content", "What is the capital of Japan?"}}}},
               {"max_tokens", 8},
               {"temperature", 0}};
  auto r = post_json(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "Tokyo");
}

INSTANTIATE_TEST_SUITE_P(Demos, DemoModel,
                         testing::Values("gemma3-demo", "ministral3-demo", "gemma4-demo"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
