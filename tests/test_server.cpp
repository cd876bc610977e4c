// The HTTP API's contract on a real server (in-process, ephemeral port):
// results equal `tandem run`, response and stream shapes, usage, logprobs,
// chat around a PromptBuilder, models / health / status / metrics, auth and
// CORS.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "server/auth.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

std::vector<int32_t> reference_prompt(const std::string& fixture) {
  std::ifstream f(fixture_dir(fixture) + "/reference.json");
  return json::parse(f)["prompt"].get<std::vector<int32_t>>();
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

std::vector<int32_t> token_ids(const HttpResult& r) {
  return r.body["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

// A stand-in for the tokenizer/template layer: one id per byte of text.
class FakePromptBuilder : public server::PromptBuilder {
 public:
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   const nlohmann::ordered_json& kwargs,
                                   const server::ChatImages* = nullptr) override {
    std::vector<int32_t> ids = {1};
    for (const auto& m : messages)
      if (m["content"].is_string()) append(m["content"].get<std::string>(), ids);
    last_kwargs = kwargs;
    return ids;
  }
  std::string token_text(int32_t id) override { return "t" + std::to_string(id); }
  std::vector<int32_t> text_prompt(const std::string& text) override {
    std::vector<int32_t> ids = {1};
    append(text, ids);
    return ids;
  }
  json last_kwargs;

 private:
  static void append(const std::string& s, std::vector<int32_t>& ids) {
    for (unsigned char c : s) ids.push_back(3 + c % 300);
  }
};

TEST(ServerApi, CompletionsStreamAndNonStreamEqualTandemRun) {
  for (const char* fixture : {"llama-f32", "gemma3_text-f32"}) {
    SCOPED_TRACE(fixture);
    const std::vector<int32_t> prompt = reference_prompt(fixture);
    auto run = run_tandem("run " + fixture_dir(fixture) + " --ids " + id_list(prompt) +
                          " -n 16 --json --ignore-eos");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto expected = json::parse(run.out)["ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(expected.size(), 16u);

    LiveServerConfig c;
    c.model_dir = fixture_dir(fixture);
    LiveServer srv(c);
    HttpResult r = post_json(srv.port(), "/v1/completions", completion_body(prompt, 16));
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(token_ids(r), expected);
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r.body["choices"][0]["text"], "");  // no detokenizer yet

    SseResult s = post_stream(srv.port(), "/v1/completions", completion_body(prompt, 16, true));
    ASSERT_EQ(s.status, 200) << s.raw;
    EXPECT_TRUE(s.done) << s.raw;
    EXPECT_EQ(s.ids(), expected);
    EXPECT_EQ(s.finish_reason(), "length");
  }
}

TEST(ServerApi, LogitBiasReachesTheSampler) {
  LiveServer srv;
  json body = {{"prompt", {5, 6, 7, 8}},
               {"max_tokens", 3},
               {"ignore_eos", true},
               {"logit_bias", {{"42", 100}}}};
  HttpResult r = post_json(srv.port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(token_ids(r), (std::vector<int32_t>{42, 42, 42}));
  body["logit_bias"] = json::object();  // empty: no bias
  r = post_json(srv.port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(token_ids(r), (std::vector<int32_t>{42, 42, 42}));
}

// n choices: one engine request each, choice i sampled with seed + i (so it
// equals an n = 1 request with that seed), indexes 0..n-1, the prompt
// counted once in the usage; the stream interleaves the choices' chunks,
// each finishing on its own, with one usage chunk and one [DONE].
TEST(ServerApi, NChoicesAreSeededSequencesInOneResponse) {
  LiveServerConfig c;
  c.options.max_concurrent = 4;
  c.engine.max_concurrent = 4;
  LiveServer srv(c);
  json body = {{"prompt", {5, 6, 7, 8}}, {"max_tokens", 6}, {"ignore_eos", true},
               {"temperature", 1.0},     {"seed", 11},      {"n", 3}};
  HttpResult r = post_json(srv.port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u);
  std::vector<std::vector<int32_t>> outs;
  for (int i = 0; i < 3; ++i) {
    const json& choice = r.body["choices"][size_t(i)];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["finish_reason"], "length");
    outs.push_back(choice["token_ids"].get<std::vector<int32_t>>());
    json one = body;
    one["n"] = 1;
    one["seed"] = 11 + i;
    HttpResult alone = post_json(srv.port(), "/v1/completions", one);
    ASSERT_EQ(alone.status, 200) << alone.raw;
    EXPECT_EQ(token_ids(alone), outs.back()) << "choice " << i;
  }
  EXPECT_FALSE(outs[0] == outs[1] && outs[1] == outs[2]);  // three draws, not one
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 18);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  SseResult st = post_stream(srv.port(), "/v1/completions", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  EXPECT_TRUE(st.done);
  std::vector<std::vector<int32_t>> streamed(3);
  int finishes = 0, usages = 0;
  for (const json& e : st.events) {
    if (e.contains("usage") && e["usage"].is_object()) {
      ++usages;
      EXPECT_EQ(e["usage"]["completion_tokens"], 18);
    }
    for (const json& ch : e["choices"]) {
      const auto ids = ch["token_ids"].get<std::vector<int32_t>>();
      auto& to = streamed[ch["index"].get<size_t>()];
      to.insert(to.end(), ids.begin(), ids.end());
      finishes += !ch["finish_reason"].is_null();
    }
  }
  EXPECT_EQ(streamed, outs);
  EXPECT_EQ(finishes, 3);
  EXPECT_EQ(usages, 1);
  // A batch of prompts, n each: prompt p's choices are p·n .. p·n + n - 1,
  // each prompt counted once in the usage.
  json batch = {{"prompt", {{5, 6, 7, 8}, {9, 10}}},
                {"max_tokens", 3},
                {"ignore_eos", true},
                {"temperature", 0},
                {"n", 2}};
  r = post_json(srv.port(), "/v1/completions", batch);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 4u);
  for (size_t p = 0; p < 2; ++p) {
    json one = batch;
    one["prompt"] = batch["prompt"][p];
    one["n"] = 1;
    const std::vector<int32_t> alone = token_ids(post_json(srv.port(), "/v1/completions", one));
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(r.body["choices"][2 * p + j]["index"], 2 * p + j);
      EXPECT_EQ(r.body["choices"][2 * p + j]["token_ids"].get<std::vector<int32_t>>(), alone);
    }
  }
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 12);

  // More choices than the server runs at once: refused, not queued forever.
  body["n"] = 5;
  body["stream"] = false;
  body.erase("stream_options");
  r = post_json(srv.port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "n");
}

TEST(ServerApi, NonStreamResponseShapeAndUsage) {
  LiveServer srv;
  json body = {{"model", "test-model"}, {"prompt", {5, 6, 7, 8}}, {"temperature", 0}};
  HttpResult r = post_json(srv.port(), "/v1/completions", body);  // default max_tokens: 16
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& j = r.body;
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "test-model");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  const size_t n = j["choices"][0]["token_ids"].size();
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], n);
  EXPECT_EQ(j["usage"]["total_tokens"], 4 + n);
  EXPECT_LE(n, 16u);
  EXPECT_FALSE(r.headers.find("X-Request-Id") == r.headers.end());
  // max_completion_tokens wins over max_tokens; the output stops there.
  body["max_tokens"] = 3;
  body["max_completion_tokens"] = 5;
  body["ignore_eos"] = true;
  r = post_json(srv.port(), "/v1/completions", body);
  EXPECT_EQ(r.body["choices"][0]["token_ids"].size(), 5u);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
}

TEST(ServerApi, HugeMaxTokensIsClippedToTheContext) {
  LiveServer srv;  // context 256
  HttpResult r = post_json(srv.port(), "/v1/completions", completion_body({5, 6, 7}, 1000000));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 256 - 3);
}

TEST(ServerApi, StreamChunksCarryUsageOnlyWhenAsked) {
  LiveServer srv;
  json body = completion_body({9, 8, 7}, 4, true);
  body["stream_options"] = {{"include_usage", true}};
  SseResult s = post_stream(srv.port(), "/v1/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  ASSERT_TRUE(s.done);
  ASSERT_EQ(s.events.size(), 4u + 2u);  // 4 tokens, the finish chunk, the usage chunk
  const std::string id = s.events[0]["id"];
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    EXPECT_EQ(s.events[i]["id"], id);
    EXPECT_EQ(s.events[i]["object"], "text_completion");
    EXPECT_TRUE(s.events[i]["usage"].is_null()) << s.events[i];
  }
  EXPECT_EQ(s.events[4]["choices"][0]["finish_reason"], "length");
  const json& last = s.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(last["usage"]["completion_tokens"], 4);
  auto ct = s.headers.find("Content-Type");
  ASSERT_NE(ct, s.headers.end());
  EXPECT_EQ(ct->second.rfind("text/event-stream", 0), 0u);

  s = post_stream(srv.port(), "/v1/completions", completion_body({9, 8, 7}, 4, true));
  ASSERT_TRUE(s.done);
  for (const json& e : s.events) EXPECT_FALSE(e.contains("usage")) << e;
}

TEST(ServerApi, CompletionLogprobs) {
  LiveServer srv;
  json body = completion_body({11, 12, 13}, 5);
  body["logprobs"] = 3;
  HttpResult r = post_json(srv.port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& lp = r.body["choices"][0]["logprobs"];
  const auto ids = token_ids(r);
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
  ASSERT_EQ(lp["top_logprobs"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], "token_id:" + std::to_string(ids[i]));
    ASSERT_EQ(lp["top_logprobs"][i].size(), 3u);
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    // Greedy: the chosen token is the most likely one.
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
    EXPECT_LE(best, 0.0);
  }
}

TEST(ServerApi, ChatNeedsATokenizerAndSaysSo) {
  LiveServer srv;
  HttpResult r = post_json(srv.port(), "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["code"], "no_chat_template");
  EXPECT_EQ(r.body["error"]["param"], "messages");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find(
                "has no tokenizer, so chat is unavailable"),
            std::string::npos);
  r = post_json(srv.port(), "/v1/completions", {{"prompt", "Once upon a time"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["code"], "no_tokenizer");
  EXPECT_EQ(r.body["error"]["param"], "prompt");
}

TEST(ServerApi, ChatWithAPromptBuilder) {
  FakePromptBuilder builder;
  LiveServerConfig c;
  c.builder = &builder;
  LiveServer srv(c);
  json body = {{"messages",
                {{{"role", "system"}, {"content", "be brief"}},
                 {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hello"}}}}}}},
               {"max_tokens", 4},
               {"temperature", 0},
               {"ignore_eos", true},
               {"logprobs", true},
               {"top_logprobs", 2},
               {"chat_template_kwargs", {{"enable_thinking", false}}}};
  HttpResult r = post_json(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(builder.last_kwargs, json({{"enable_thinking", false}}));
  const json& j = r.body;
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["token_ids"].size(), 4u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 1 + 8);  // "be brief": the builder's 1 + 8 bytes
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(content[0]["token"].is_string());

  body["stream"] = true;
  body.erase("logprobs");
  body.erase("top_logprobs");
  SseResult s = post_stream(srv.port(), "/v1/chat/completions", body);
  ASSERT_EQ(s.status, 200) << s.raw;
  ASSERT_TRUE(s.done);
  ASSERT_EQ(s.events.size(), 5u);
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(s.events[1]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(s.events[4]["choices"][0]["delta"], json::object());
  EXPECT_EQ(s.finish_reason(), "length");
  EXPECT_EQ(s.ids(), j["choices"][0]["token_ids"].get<std::vector<int32_t>>());
  // A text prompt goes through the builder too.
  r = post_json(srv.port(), "/v1/completions",
                {{"prompt", "abc"}, {"max_tokens", 2}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 4);
}

TEST(ServerApi, ModelsHealthStatusMetrics) {
  LiveServer srv;
  HttpResult r = http_get(srv.port(), "/v1/models");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["object"], "list");
  ASSERT_EQ(r.body["data"].size(), 1u);
  EXPECT_EQ(r.body["data"][0]["id"], "test-model");
  EXPECT_EQ(r.body["data"][0]["object"], "model");
  EXPECT_EQ(r.body["data"][0]["max_model_len"], 256);
  EXPECT_EQ(http_get(srv.port(), "/v1/models/test-model").status, 200);
  r = http_get(srv.port(), "/v1/models/gpt-4");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["error"]["code"], "model_not_found");

  r = http_get(srv.port(), "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["status"], "ok");

  ASSERT_EQ(post_json(srv.port(), "/v1/completions", completion_body({1, 2}, 3)).status, 200);
  r = http_get(srv.port(), "/v1/status");
  ASSERT_EQ(r.status, 200);
  std::set<std::string> keys;
  for (auto& [k, v] : r.body.items()) keys.insert(k);
  const std::set<std::string> expected = {"status",
                                          "model",
                                          "device",
                                          "uptime_s",
                                          "steps_executed",
                                          "num_running",
                                          "num_waiting",
                                          "total_requests_processed",
                                          "total_requests_failed",
                                          "total_requests_cancelled",
                                          "total_prompt_tokens",
                                          "total_completion_tokens",
                                          "generation_tps",
                                          "prompt_tps",
                                          "kv_blocks_used",
                                          "kv_blocks_total",
                                          "kv_blocks_cached",
                                          "total_cached_prompt_tokens",
                                          "kv_cache_dtype",
                                          "gemm_precision",
                                          "text_lane_requests",
                                          "vision_lane_requests",
                                          "vision_encoder_calls",
                                          "images_processed",
                                          "vision_encode_seconds",
                                          "images_waiting",
                                          "vision",
                                          "watchdog_fired",
                                          "last_error",
                                          "requests"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(r.body["status"], "ok");
  EXPECT_EQ(r.body["model"], "test-model");
  EXPECT_EQ(r.body["device"], "cpu");  // no "gpu_memory" on the CPU
  EXPECT_EQ(r.body["kv_cache_dtype"], "f32");
  EXPECT_EQ(r.body["gemm_precision"], "bf16");  // --gemm-precision's default, on the CPU too
  EXPECT_EQ(r.body["total_requests_processed"], 1);
  EXPECT_EQ(r.body["total_completion_tokens"], 3);
  EXPECT_EQ(r.body["total_prompt_tokens"], 2);
  EXPECT_TRUE(r.body["last_error"].is_null());
  EXPECT_TRUE(r.body["requests"].is_array());

  const std::vector<std::string> lines = {
      "tandem_requests_processed_total 1",
      "tandem_generation_tokens_total 3",
      "tandem_http_responses_total{route=\"/v1/completions\",status=\"200\"} 1",
      "tandem_generations_finished_total{reason=\"length\"} 1",
      "tandem_ready 1",
      "tandem_time_to_first_token_seconds_count 1",
      "# TYPE tandem_request_duration_seconds histogram"};
  // An HTTP response is counted once it has been written (the server's
  // logger), which can be just after the client has read it: poll briefly.
  auto all_present = [&] {
    for (const std::string& line : lines)
      if (r.raw.find(line) == std::string::npos) return false;
    return true;
  };
  for (int attempt = 0; attempt < 40; ++attempt) {
    r = http_get(srv.port(), "/metrics");
    if (r.status != 200 || all_present()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.find("Content-Type")->second.rfind("text/plain", 0), 0u);
  for (const std::string& line : lines)
    EXPECT_NE(r.raw.find(line), std::string::npos) << line << "\n" << r.raw;
}

TEST(ServerApi, LoadingAnswers503WithRetryAfter) {
  LiveServerConfig c;
  c.attach = false;
  LiveServer srv(c);
  HttpResult r = http_get(srv.port(), "/health");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body["status"], "loading");
  EXPECT_NE(r.headers.find("Retry-After"), r.headers.end());
  r = post_json(srv.port(), "/v1/completions", completion_body({1, 2}, 3));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body["error"]["code"], "model_loading");
  EXPECT_EQ(r.body["error"]["type"], "server_error");
  EXPECT_NE(r.headers.find("Retry-After"), r.headers.end());
  EXPECT_EQ(http_get(srv.port(), "/v1/status").body["status"], "loading");
  EXPECT_EQ(http_get(srv.port(), "/metrics").status, 200);
}

TEST(ServerApi, ApiKeyIsRequiredExceptOnHealthAndMetrics) {
  LiveServerConfig c;
  c.options.api_key = "sekret-key";
  LiveServer srv(c);
  const json body = completion_body({1, 2}, 2);
  HttpResult r = post_json(srv.port(), "/v1/completions", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  EXPECT_EQ(
      post_json(srv.port(), "/v1/completions", body, {{"Authorization", "Bearer wrong"}}).status,
      401);
  EXPECT_EQ(
      post_json(srv.port(), "/v1/completions", body, {{"Authorization", "sekret-key"}}).status,
      401);
  EXPECT_EQ(post_json(srv.port(), "/v1/completions", body, {{"x-api-key", "sekret-ke"}}).status,
            401);
  EXPECT_EQ(post_json(srv.port(), "/v1/completions", body, {{"Authorization", "Bearer sekret-key"}})
                .status,
            200);
  EXPECT_EQ(post_json(srv.port(), "/v1/completions", body, {{"x-api-key", "sekret-key"}}).status,
            200);
  EXPECT_EQ(http_get(srv.port(), "/v1/models").status, 401);
  EXPECT_EQ(http_get(srv.port(), "/v1/status").status, 401);
  EXPECT_EQ(http_get(srv.port(), "/health").status, 200);
  EXPECT_EQ(http_get(srv.port(), "/metrics").status, 200);

  EXPECT_TRUE(server::constant_time_equals("abc", "abc"));
  EXPECT_FALSE(server::constant_time_equals("abc", "abd"));
  EXPECT_FALSE(server::constant_time_equals("abc", "ab"));
  EXPECT_FALSE(server::constant_time_equals("abc", "abcd"));
  EXPECT_FALSE(server::constant_time_equals("abc", ""));
  EXPECT_TRUE(server::api_key_authorized("k", "bearer k", ""));
  EXPECT_FALSE(server::api_key_authorized("k", "Basic k", ""));
}

TEST(ServerApi, CorsPreflightAndHeaders) {
  LiveServerConfig c;
  c.options.cors_origins = {"http://app.example"};
  c.options.api_key = "k";
  LiveServer srv(c);
  auto client = httplib::Client("127.0.0.1", srv.port());
  auto r = client.Options("/v1/chat/completions",
                          {{"Origin", "http://app.example"},
                           {"Access-Control-Request-Method", "POST"},
                           {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);  // open: no API key on a preflight
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(r->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  HttpResult g = http_get(srv.port(), "/health", {{"Origin", "http://app.example"}});
  EXPECT_EQ(g.headers.find("Access-Control-Allow-Origin")->second, "http://app.example");
  g = http_get(srv.port(), "/health", {{"Origin", "http://evil.example"}});
  EXPECT_EQ(g.headers.find("Access-Control-Allow-Origin"), g.headers.end());

  LiveServer plain;
  auto c2 = httplib::Client("127.0.0.1", plain.port());
  r = c2.Options("/v1/completions", {{"Origin", "http://app.example"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "");
}

}  // namespace

namespace {

TEST(ServerCli, BadFlagsAndMissingModelsFailFastWithExitOne) {
  auto r = run_tandem("serve --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--api-key"), std::string::npos) << r.out;
  const std::string model = fixture_dir("llama-f32");
  r = run_tandem("serve " + model + " --port 0 --kv-memory 12Q");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-memory: '12Q' is not a size"), std::string::npos) << r.err;
  r = run_tandem("serve " + model + " --port 70000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--port"), std::string::npos) << r.err;
  r = run_tandem("serve " + model + " --port 0 --step-timeout 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--step-timeout"), std::string::npos) << r.err;
  r = run_tandem("serve /nonexistent/model --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model"), std::string::npos) << r.err;
  r = run_tandem("serve " + model + " --host 256.0.0.1 --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot listen on 256.0.0.1"), std::string::npos) << r.err;
}

}  // namespace
