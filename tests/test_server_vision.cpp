// The vision lane end to end, on the tiny multimodal checkpoints with their
// small tokenizers (tests/fixtures/vision/<family>/prompts.json, from
// transformers' processors): prompt ids after placeholder expansion equal the
// processor's, an image chat through `tandem serve` matches transformers'
// logits, and every image failure is its own request's 400 while the server
// keeps serving.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "image/image.h"
#include "model/model.h"
#include "model/vision_tower.h"
#include "server/chat_images.h"
#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

json prompts(const std::string& family) {
  std::ifstream f(vision_fixture_dir(family) + "/prompts.json");
  return json::parse(f);
}

std::string data_url(const std::string& family, const std::string& file) {
  return "data:image/png;base64," + base64(file_bytes(vision_fixture_dir(family) + "/" + file));
}

// The fixture's messages with each image file name turned into a data URL.
json with_data_urls(const std::string& family, json messages) {
  for (json& m : messages)
    if (m["content"].is_array())
      for (json& part : m["content"])
        if (part["type"] == "image_url")
          part["image_url"]["url"] = data_url(family, part["image_url"]["url"]);
  return messages;
}

json chat_body(const json& messages, int max_tokens = 1) {
  return {{"messages", messages},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"logprobs", true},
          {"top_logprobs", 5}};
}

// The five largest values of log_softmax(row), descending.
std::vector<double> top5_logprobs(const json& row) {
  std::vector<double> v = row.get<std::vector<double>>();
  double mx = *std::max_element(v.begin(), v.end()), sum = 0;
  for (double x : v) sum += std::exp(x - mx);
  for (double& x : v) x = x - mx - std::log(sum);
  std::sort(v.begin(), v.end(), std::greater<>());
  v.resize(5);
  return v;
}

class ServerVision : public testing::TestWithParam<const char*> {};

TEST_P(ServerVision, PromptIdsEqualTheProcessors) {
  // The server's own path (model_text + chat_images) against the family's
  // transformers processor, for a text-only, a one-image and a two-image
  // conversation.
  const std::string family = GetParam();
  const std::string dir = vision_model_dir(family);
  auto model = load_model(dir);
  auto tower = VisionTower::load(*model);
  auto text = server::ModelText::load(dir);
  ASSERT_TRUE(text && text->has_chat_template());
  const json ref = prompts(family);
  for (const json& c : ref["cases"]) {
    const json messages = with_data_urls(family, c["messages"]);
    server::ChatImageInputs in = server::load_chat_images(messages, *tower, *text, {});
    const auto ids =
        text->chat_prompt(messages, nullptr, nullptr, in.images.empty() ? nullptr : &in.text);
    EXPECT_EQ(ids, c["input_ids"].get<std::vector<int32_t>>()) << family << " " << c["name"];
    EXPECT_EQ(in.images.size(), c["images"].size());
  }
}

TEST_P(ServerVision, ImageChatMatchesTransformersAndCountsTheLane) {
  const std::string family = GetParam();
  ChildServer srv({vision_model_dir(family), "--threads", "1"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  const json ref = prompts(family);
  int images = 0;
  for (const json& c : ref["cases"]) {
    auto r = post_json(srv.port(), "/v1/chat/completions",
                       chat_body(with_data_urls(family, c["messages"])));
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], c["input_ids"].size()) << c["name"];
    const json& top = r.body["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
    ASSERT_EQ(top.size(), 5u);
    const std::vector<double> want = top5_logprobs(c["logits_last"]);
    for (size_t i = 0; i < 5; ++i)
      EXPECT_NEAR(top[i]["logprob"].get<double>(), want[i], 2e-3) << family << " " << c["name"];
    images += int(c["images"].size());
  }
  const json st = http_get(srv.port(), "/v1/status").body;
  EXPECT_EQ(st["vision_lane_requests"], 2);
  EXPECT_EQ(st["text_lane_requests"], 1);
  EXPECT_EQ(st["images_processed"], images);
  EXPECT_GE(st["vision_encoder_calls"].get<int>(), 1);
  EXPECT_GT(st["vision_encode_seconds"].get<double>(), 0.0);
  EXPECT_EQ(st["vision"]["loaded"], true);
  EXPECT_EQ(st["vision"]["device"], "cpu");
  const std::string metrics = http_get(srv.port(), "/metrics").raw;
  EXPECT_NE(metrics.find("tandem_images_processed_total " + std::to_string(images)),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem_vision_lane_requests_total 2"), std::string::npos);
  EXPECT_NE(metrics.find("tandem_vision_encode_seconds_total "), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Families, ServerVision, testing::Values("gemma3", "gemma4", "mistral3"));

TEST(ServerVisionLanes, TextOnlyLoadsNoVisionAndAnswersTextTheSame) {
  const json ref = prompts("gemma3");
  const json text_msgs = ref["cases"][0]["messages"];
  const json image_msgs = with_data_urls("gemma3", ref["cases"][1]["messages"]);
  json full_top;
  {
    ChildServer srv({vision_model_dir("gemma3"), "--threads", "1"});
    ASSERT_TRUE(srv.ready()) << srv.log();
    auto r = post_json(srv.port(), "/v1/chat/completions", chat_body(text_msgs, 4));
    ASSERT_EQ(r.status, 200) << r.raw;
    full_top = r.body["choices"][0]["logprobs"];
    const json st = http_get(srv.port(), "/v1/status").body;
    EXPECT_EQ(st["vision_encoder_calls"], 0);
    EXPECT_EQ(st["vision_encode_seconds"], 0.0);
    EXPECT_EQ(st["text_lane_requests"], 1);
  }
  ChildServer srv({vision_model_dir("gemma3"), "--threads", "1", "--text-only"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  EXPECT_NE(srv.log().find("vision tower is not loaded"), std::string::npos) << srv.log();
  const json st = http_get(srv.port(), "/v1/status").body;
  EXPECT_EQ(st["vision"]["loaded"], false);
  EXPECT_EQ(st["vision"]["device"], nullptr);
  EXPECT_EQ(st["vision"]["in_checkpoint"], true);
  EXPECT_GT(st["vision"]["weight_bytes"].get<int64_t>(), 0);
  // Text: the same tokens and logprobs as with the tower loaded.
  auto r = post_json(srv.port(), "/v1/chat/completions", chat_body(text_msgs, 4));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["logprobs"], full_top);
  // Images: 400 saying how to enable them.
  r = post_json(srv.port(), "/v1/chat/completions", chat_body(image_msgs));
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["code"], "images_unavailable");
  EXPECT_NE(r.raw.find("without --text-only"), std::string::npos) << r.raw;
  // The alias.
  ChildServer alias({vision_model_dir("gemma3"), "--threads", "1", "--no-mllm"});
  ASSERT_TRUE(alias.ready()) << alias.log();
  EXPECT_EQ(http_get(alias.port(), "/v1/status").body["vision"]["loaded"], false);
}

TEST(ServerVisionLanes, ATowerThatFailsToLoadLeavesTextWorking) {
  // A vision_config whose hidden size does not match the tensors.
  TempDir dir;
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(vision_model_dir("gemma3")))
    if (e.path().filename() != "config.json")
      fs::create_symlink(fs::read_symlink(e.path()),
                         dir.path() + "/" + e.path().filename().string());
  json cfg = json::parse(file_bytes(vision_model_dir("gemma3") + "/config.json"));
  cfg["vision_config"]["hidden_size"] = 48;
  std::ofstream(dir.path() + "/config.json") << cfg.dump();
  ChildServer srv({dir.path(), "--threads", "1"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  EXPECT_NE(srv.log().find("the vision tower failed to load"), std::string::npos) << srv.log();
  const json ref = prompts("gemma3");
  auto r = post_json(srv.port(), "/v1/chat/completions", chat_body(ref["cases"][0]["messages"]));
  EXPECT_EQ(r.status, 200) << r.raw;
  r = post_json(srv.port(), "/v1/chat/completions",
                chat_body(with_data_urls("gemma3", ref["cases"][1]["messages"])));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.raw.find("failed to load"), std::string::npos) << r.raw;
}

TEST(ServerVisionLanes, BrokenImagesAre400sForTheirRequestAlone) {
  ChildServer srv({vision_model_dir("gemma3"), "--threads", "1"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  auto image_chat = [&](const std::string& url) {
    json m = json::array(
        {{{"role", "user"},
          {"content", json::array({{{"type", "text"}, {"text", "Look:"}},
                                   {{"type", "image_url"}, {"image_url", {{"url", url}}}}})}}});
    return post_json(srv.port(), "/v1/chat/completions", chat_body(m));
  };
  struct Case {
    const char* name;
    std::string url;
    const char* code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"not base64", "data:image/png;base64,@@@@", "invalid_image", "cannot use this image"},
      {"not an image", "data:image/png;base64,aGVsbG8gd29ybGQ=", "invalid_image",
       "cannot use this image"},
      {"truncated PNG", data_url("gemma3", "input_0.png").substr(0, 80), "invalid_image",
       "cannot use this image"},
      {"remote URL without the flag", "http://127.0.0.1:1/cat.png", "invalid_value",
       "--allow-image-urls"},
      {"another scheme", "file:///etc/passwd", "invalid_value", "data: URL"},
  };
  for (const Case& c : cases) {
    auto r = image_chat(c.url);
    EXPECT_EQ(r.status, 400) << c.name << ": " << r.raw;
    EXPECT_EQ(r.body["error"]["code"], c.code) << c.name;
    EXPECT_EQ(r.body["error"]["param"], "messages[0].content[1].image_url") << c.name;
    EXPECT_NE(r.raw.find(c.says), std::string::npos) << c.name << ": " << r.raw;
  }
  // Audio is refused by name.
  json audio = json::array(
      {{{"role", "user"},
        {"content", json::array({{{"type", "input_audio"},
                                  {"input_audio", {{"data", "AAAA"}, {"format", "wav"}}}}})}}});
  auto r = post_json(srv.port(), "/v1/chat/completions", chat_body(audio));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.raw.find("audio input is not supported"), std::string::npos) << r.raw;
  // The server still serves images and text.
  r = image_chat(data_url("gemma3", "input_0.png"));
  EXPECT_EQ(r.status, 200) << r.raw;
  const json st = http_get(srv.port(), "/v1/status").body;
  EXPECT_EQ(st["images_processed"], 1);
  EXPECT_EQ(st["total_requests_failed"], 0);
}

TEST(ServerVisionLanes, RemoteImageUrlsWithTheFlag) {
  // A local HTTP server hands out the PNG; the model sees the same image as
  // through a data URL.
  httplib::Server files;
  const std::string png = file_bytes(vision_fixture_dir("gemma3") + "/input_0.png");
  files.Get("/cat.png", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(png, "image/png");
  });
  const int file_port = files.bind_to_any_port("127.0.0.1");
  std::thread t([&] { files.listen_after_bind(); });
  ChildServer srv({vision_model_dir("gemma3"), "--threads", "1", "--allow-image-urls",
                   "--image-url-timeout", "5"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  auto ask = [&](const std::string& url) {
    json m = json::array(
        {{{"role", "user"},
          {"content", json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}}})}}});
    return post_json(srv.port(), "/v1/chat/completions", chat_body(m));
  };
  auto remote = ask("http://127.0.0.1:" + std::to_string(file_port) + "/cat.png");
  auto inline_ = ask(data_url("gemma3", "input_0.png"));
  auto missing = ask("http://127.0.0.1:" + std::to_string(file_port) + "/nope.png");
  files.stop();
  t.join();
  ASSERT_EQ(remote.status, 200) << remote.raw;
  ASSERT_EQ(inline_.status, 200) << inline_.raw;
  // The same pixels: the inline request reuses the remote one's KV blocks
  // (the prefix cache keys images by their pixels), so its logprobs match to
  // the last bits, not bit for bit.
  const json& a = remote.body["choices"][0]["logprobs"]["content"];
  const json& b = inline_.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["token"], b[i]["token"]);
    EXPECT_NEAR(a[i]["logprob"].get<double>(), b[i]["logprob"].get<double>(), 1e-4);
  }
  EXPECT_GT(inline_.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(missing.status, 400);
  EXPECT_NE(missing.raw.find("HTTP 404"), std::string::npos) << missing.raw;
}

}  // namespace
