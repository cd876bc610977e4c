// The bad-input corpus: every malformed or out-of-range request gets its
// documented status, the OpenAI error shape, the right `code` and the `param`
// at fault — and the server keeps serving after all of them.
#include <gtest/gtest.h>

#include "test_server_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

constexpr const char* kKey = "corpus-key";

struct Case {
  const char* name;
  const char* method;
  const char* path;
  std::string body;
  int status;
  const char* code;
  const char* param;  // nullptr: the error's param must be null
  std::string content_type = "application/json";
  httplib::Headers headers = {{"Authorization", std::string("Bearer ") + kKey}};
};

const char* kC = "/v1/completions";
const char* kChat = "/v1/chat/completions";

// A completions body with one extra field (raw JSON text).
std::string comp(const std::string& extra) {
  return std::string(R"({"prompt": [1, 2, 3], "max_tokens": 2)") +
         (extra.empty() ? "" : ", " + extra) + "}";
}
// A chat body with the given messages (raw JSON) and one extra field.
std::string chat(const std::string& messages, const std::string& extra = "") {
  return R"({"messages": )" + messages + (extra.empty() ? "" : ", " + extra) + "}";
}
const char* kUserHi = R"([{"role": "user", "content": "hi"}])";

std::string long_prompt(int n) {
  std::string s = R"({"prompt": [)";
  for (int i = 0; i < n; ++i) s += (i ? ",7" : "7");
  return s + "]}";
}

std::vector<Case> corpus() {
  return {
      // The body itself.
      {"malformed JSON", "POST", kC, R"({"prompt": [1, 2)", 400, "invalid_json", nullptr},
      {"empty body", "POST", kC, "", 400, "invalid_json", nullptr},
      {"trailing garbage", "POST", kC, R"({"prompt": [1]} x)", 400, "invalid_json", nullptr},
      {"body is an array", "POST", kC, "[1, 2]", 400, "invalid_type", nullptr},
      {"body is a string", "POST", kC, R"("hello")", 400, "invalid_type", nullptr},
      {"invalid UTF-8", "POST", kC, comp("\"user\": \"\xff\xfe\""), 400, "invalid_utf8", nullptr},
      {"truncated UTF-8", "POST", kC, comp("\"user\": \"\xe2\x82\""), 400, "invalid_utf8", nullptr},
      {"lone surrogate", "POST", kC, comp(R"("user": "\udc00")"), 400, "invalid_utf8", nullptr},
      // prompt
      {"missing prompt", "POST", kC, "{}", 400, "missing_required_parameter", "prompt"},
      {"null prompt", "POST", kC, R"({"prompt": null})", 400, "missing_required_parameter",
       "prompt"},
      {"prompt is a number", "POST", kC, R"({"prompt": 5})", 400, "invalid_type", "prompt"},
      {"empty token-id array", "POST", kC, R"({"prompt": []})", 400, "invalid_value", "prompt"},
      {"empty nested array", "POST", kC, R"({"prompt": [[]]})", 400, "invalid_value", "prompt[0]"},
      {"string inside ids", "POST", kC, R"({"prompt": [1, "a"]})", 400, "invalid_type",
       "prompt[1]"},
      {"float id", "POST", kC, R"({"prompt": [1.5]})", 400, "invalid_type", "prompt[0]"},
      {"negative id", "POST", kC, R"({"prompt": [-1]})", 400, "invalid_value", "prompt"},
      {"id out of vocab", "POST", kC, R"({"prompt": [1, 320]})", 400, "invalid_value", "prompt"},
      {"too-long prompt", "POST", kC, long_prompt(300), 400, "context_length_exceeded", "prompt"},
      {"a batch with a number", "POST", kC, R"({"prompt": [[1], 5]})", 400, "invalid_type",
       "prompt[1]"},
      {"a batch of 17", "POST", kC,
       R"({"prompt": [[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1]]})", 400,
       "invalid_value", "prompt"},
      {"a batch with an id out of vocab", "POST", kC, R"({"prompt": [[1], [2, 999]]})", 400,
       "invalid_value", "prompt"},
      {"string prompt without tokenizer", "POST", kC, R"({"prompt": "hello"})", 400, "no_tokenizer",
       "prompt"},
      // model
      {"unknown model", "POST", kC, comp(R"("model": "gpt-4o")"), 404, "model_not_found", "model"},
      {"model not a string", "POST", kC, comp(R"("model": 5)"), 400, "invalid_type", "model"},
      // max_tokens
      {"max_tokens 0", "POST", kC, R"({"prompt": [1], "max_tokens": 0})", 400, "invalid_value",
       "max_tokens"},
      {"max_tokens negative", "POST", kC, R"({"prompt": [1], "max_tokens": -5})", 400,
       "invalid_value", "max_tokens"},
      {"max_tokens string", "POST", kC, R"({"prompt": [1], "max_tokens": "10"})", 400,
       "invalid_type", "max_tokens"},
      {"max_tokens float", "POST", kC, R"({"prompt": [1], "max_tokens": 1.5})", 400, "invalid_type",
       "max_tokens"},
      {"max_completion_tokens 0", "POST", kC, comp(R"("max_completion_tokens": 0)"), 400,
       "invalid_value", "max_completion_tokens"},
      // sampling
      {"negative temperature", "POST", kC, comp(R"("temperature": -1)"), 400, "invalid_value",
       "temperature"},
      {"temperature above 2", "POST", kC, comp(R"("temperature": 2.5)"), 400, "invalid_value",
       "temperature"},
      {"temperature string", "POST", kC, comp(R"("temperature": "hot")"), 400, "invalid_type",
       "temperature"},
      {"top_p 0", "POST", kC, comp(R"("top_p": 0)"), 400, "invalid_value", "top_p"},
      {"top_p above 1", "POST", kC, comp(R"("top_p": 1.5)"), 400, "invalid_value", "top_p"},
      {"top_k string", "POST", kC, comp(R"("top_k": "5")"), 400, "invalid_type", "top_k"},
      {"top_k below -1", "POST", kC, comp(R"("top_k": -2)"), 400, "invalid_value", "top_k"},
      {"min_p above 1", "POST", kC, comp(R"("min_p": 2)"), 400, "invalid_value", "min_p"},
      {"repetition_penalty 0", "POST", kC, comp(R"("repetition_penalty": 0)"), 400, "invalid_value",
       "repetition_penalty"},
      {"presence_penalty 3", "POST", kC, comp(R"("presence_penalty": 3)"), 400, "invalid_value",
       "presence_penalty"},
      {"frequency_penalty -3", "POST", kC, comp(R"("frequency_penalty": -3)"), 400, "invalid_value",
       "frequency_penalty"},
      {"seed string", "POST", kC, comp(R"("seed": "abc")"), 400, "invalid_type", "seed"},
      {"seed float", "POST", kC, comp(R"("seed": 1.5)"), 400, "invalid_type", "seed"},
      {"n=17", "POST", kC, comp(R"("n": 17)"), 400, "invalid_value", "n"},
      {"n=0", "POST", kC, comp(R"("n": 0)"), 400, "invalid_value", "n"},
      {"n a string", "POST", kC, comp(R"("n": "2")"), 400, "invalid_type", "n"},
      // stop
      {"stop number", "POST", kC, comp(R"("stop": 5)"), 400, "invalid_type", "stop"},
      {"five stops", "POST", kC, comp(R"("stop": ["a", "b", "c", "d", "e"])"), 400, "invalid_value",
       "stop"},
      {"stop array of numbers", "POST", kC, comp(R"("stop": [1])"), 400, "invalid_type", "stop[0]"},
      {"empty stop string", "POST", kC, comp(R"("stop": "")"), 400, "invalid_value", "stop"},
      {"stop without tokenizer", "POST", kC, comp(R"("stop": "x")"), 400, "invalid_value", "stop"},
      // logprobs, stream, misc
      {"logprobs 21", "POST", kC, comp(R"("logprobs": 21)"), 400, "invalid_value", "logprobs"},
      {"logprobs bool on completions", "POST", kC, comp(R"("logprobs": true)"), 400, "invalid_type",
       "logprobs"},
      {"stream string", "POST", kC, comp(R"("stream": "yes")"), 400, "invalid_type", "stream"},
      {"stream_options without stream", "POST", kC,
       comp(R"("stream_options": {"include_usage": true})"), 400, "invalid_value",
       "stream_options"},
      {"stream_options not an object", "POST", kC, comp(R"("stream": true, "stream_options": 1)"),
       400, "invalid_type", "stream_options"},
      {"include_usage string", "POST", kC,
       comp(R"("stream": true, "stream_options": {"include_usage": "yes"})"), 400, "invalid_type",
       "stream_options.include_usage"},
      {"negative timeout", "POST", kC, comp(R"("timeout": -1)"), 400, "invalid_value", "timeout"},
      {"timeout string", "POST", kC, comp(R"("timeout": "1")"), 400, "invalid_type", "timeout"},
      {"ignore_eos number", "POST", kC, comp(R"("ignore_eos": 1)"), 400, "invalid_type",
       "ignore_eos"},
      {"echo", "POST", kC, comp(R"("echo": true)"), 400, "unsupported_value", "echo"},
      {"best_of 2", "POST", kC, comp(R"("best_of": 2)"), 400, "unsupported_value", "best_of"},
      {"suffix", "POST", kC, comp(R"("suffix": "x")"), 400, "unsupported_value", "suffix"},
      {"logit_bias an array", "POST", kC, comp(R"("logit_bias": [1])"), 400, "invalid_type",
       "logit_bias"},
      {"logit_bias key not an id", "POST", kC, comp(R"("logit_bias": {"x1": 5})"), 400,
       "invalid_value", "logit_bias.x1"},
      {"logit_bias negative key", "POST", kC, comp(R"("logit_bias": {"-1": 5})"), 400,
       "invalid_value", "logit_bias.-1"},
      {"logit_bias value a string", "POST", kC, comp(R"("logit_bias": {"1": "5"})"), 400,
       "invalid_type", "logit_bias.1"},
      {"logit_bias past 100", "POST", kC, comp(R"("logit_bias": {"1": 100.5})"), 400,
       "invalid_value", "logit_bias.1"},
      {"logit_bias id outside the vocabulary", "POST", kC, comp(R"("logit_bias": {"99999999": 5})"),
       400, "invalid_value", "logit_bias"},
      // chat
      {"missing messages", "POST", kChat, "{}", 400, "missing_required_parameter", "messages"},
      {"empty messages", "POST", kChat, chat("[]"), 400, "invalid_value", "messages"},
      {"messages a string", "POST", kChat, chat(R"("hi")"), 400, "invalid_type", "messages"},
      {"message a number", "POST", kChat, chat("[5]"), 400, "invalid_type", "messages[0]"},
      {"message without role", "POST", kChat, chat(R"([{"content": "hi"}])"), 400,
       "missing_required_parameter", "messages[0].role"},
      {"unknown role", "POST", kChat, chat(R"([{"role": "wizard", "content": "hi"}])"), 400,
       "invalid_value", "messages[0].role"},
      {"user message without content", "POST", kChat, chat(R"([{"role": "user"}])"), 400,
       "missing_required_parameter", "messages[0].content"},
      {"content a number", "POST", kChat, chat(R"([{"role": "user", "content": 5}])"), 400,
       "invalid_type", "messages[0].content"},
      {"empty content parts", "POST", kChat, chat(R"([{"role": "user", "content": []}])"), 400,
       "invalid_value", "messages[0].content"},
      {"part without type", "POST", kChat,
       chat(R"([{"role": "user", "content": [{"text": "hi"}]}])"), 400,
       "missing_required_parameter", "messages[0].content[0].type"},
      {"unknown part type", "POST", kChat,
       chat(R"([{"role": "user", "content": [{"type": "video", "url": "x"}]}])"), 400,
       "unsupported_value", "messages[0].content[0].type"},
      {"text part not a string", "POST", kChat,
       chat(R"([{"role": "user", "content": [{"type": "text", "text": 5}]}])"), 400, "invalid_type",
       "messages[0].content[0].text"},
      {"audio input", "POST", kChat,
       chat(
           R"([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}])"),
       400, "unsupported_value", "messages[0].content[0].type"},
      {"tool message without id", "POST", kChat,
       chat(R"([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}])"), 400,
       "missing_required_parameter", "messages[1].tool_call_id"},
      {"tools not an array", "POST", kChat, chat(kUserHi, R"("tools": {})"), 400, "invalid_type",
       "tools"},
      {"tool without function", "POST", kChat, chat(kUserHi, R"("tools": [{"type": "function"}])"),
       400, "missing_required_parameter", "tools[0].function"},
      {"top_logprobs 21", "POST", kChat, chat(kUserHi, R"("logprobs": true, "top_logprobs": 21)"),
       400, "invalid_value", "top_logprobs"},
      {"top_logprobs without logprobs", "POST", kChat, chat(kUserHi, R"("top_logprobs": 2)"), 400,
       "invalid_value", "top_logprobs"},
      {"chat logprobs a number", "POST", kChat, chat(kUserHi, R"("logprobs": 1)"), 400,
       "invalid_type", "logprobs"},
      {"chat_template_kwargs a string", "POST", kChat,
       chat(kUserHi, R"("chat_template_kwargs": "x")"), 400, "invalid_type",
       "chat_template_kwargs"},
      {"chat n=-1", "POST", kChat, chat(kUserHi, R"("n": -1)"), 400, "invalid_value", "n"},
      {"chat unknown model", "POST", kChat, chat(kUserHi, R"("model": "nope")"), 404,
       "model_not_found", "model"},
      {"valid chat without a template", "POST", kChat, chat(kUserHi), 400, "no_chat_template",
       "messages"},
      // HTTP level
      {"text/plain body", "POST", kC, comp(""), 415, "unsupported_media_type", nullptr,
       "text/plain"},
      {"form body", "POST", kC, "prompt=1", 415, "unsupported_media_type", nullptr,
       "application/x-www-form-urlencoded"},
      {"GET on completions", "GET", kC, "", 405, "method_not_allowed", nullptr},
      {"GET on chat", "GET", kChat, "", 405, "method_not_allowed", nullptr},
      {"PUT on completions", "PUT", kC, comp(""), 405, "method_not_allowed", nullptr},
      {"POST on models", "POST", "/v1/models", "{}", 405, "method_not_allowed", nullptr},
      {"DELETE on health", "DELETE", "/health", "", 405, "method_not_allowed", nullptr},
      {"unknown route", "POST", "/v1/embeddings", "{}", 404, "not_found", nullptr},
      {"cancel an unknown request", "POST", "/v1/requests/req-999999/cancel", "", 404,
       "request_not_found", "id"},
      {"no API key", "POST", kC, comp(""), 401, "invalid_api_key", nullptr, "application/json", {}},
      {"wrong API key",
       "POST",
       kC,
       comp(""),
       401,
       "invalid_api_key",
       nullptr,
       "application/json",
       {{"Authorization", "Bearer nope"}}},
      {"API key without Bearer",
       "POST",
       kC,
       comp(""),
       401,
       "invalid_api_key",
       nullptr,
       "application/json",
       {{"Authorization", kKey}}},
  };
}

HttpResult send(int port, const Case& c) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(10, 0);
  httplib::Request req;
  req.method = c.method;
  req.path = c.path;
  req.headers = c.headers;
  if (c.method != std::string("GET") && c.method != std::string("DELETE")) {
    req.body = c.body;
    req.set_header("Content-Type", c.content_type);
  }
  HttpResult out;
  auto r = cli.send(req);
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  out.body = json::parse(r->body, nullptr, false);
  out.headers = r->headers;
  return out;
}

void expect_error_shape(const HttpResult& r, int status, const char* code, const char* param,
                        const std::string& what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.raw;
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << what << ": " << r.raw;
  const json& e = r.body["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << what;
  EXPECT_EQ(e["type"], status >= 500 ? "server_error" : "invalid_request_error") << what;
  EXPECT_EQ(e["code"], code) << what << ": " << r.raw;
  if (param)
    EXPECT_EQ(e["param"], param) << what << ": " << r.raw;
  else
    EXPECT_TRUE(e["param"].is_null()) << what << ": " << r.raw;
}

TEST(ServerBadInput, EveryCaseGetsItsStatusAndErrorShape) {
  LiveServerConfig c;
  c.options.api_key = kKey;
  LiveServer srv(c);
  const std::vector<Case> cases = corpus();
  ASSERT_GE(cases.size(), 40u);
  for (const Case& k : cases) {
    HttpResult r = send(srv.port(), k);
    expect_error_shape(r, k.status, k.code, k.param, k.name);
  }
  // Still serving, and nothing leaked into the engine.
  HttpResult ok = post_json(srv.port(), "/v1/completions", completion_body({1, 2, 3}, 4),
                            {{"Authorization", std::string("Bearer ") + kKey}});
  ASSERT_EQ(ok.status, 200) << ok.raw;
  EXPECT_EQ(ok.body["choices"][0]["token_ids"].size(), 4u);
  EXPECT_EQ(http_get(srv.port(), "/health").status, 200);
  const EngineStatus st = srv.engine().status();
  EXPECT_EQ(st.total_requests_processed, 1u);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST(ServerBadInput, OversizedBodyAndBrokenHttp) {
  LiveServer srv;
  // 9 MiB (the limit is 8): httplib reads and discards it, then answers 413.
  HttpResult r = http_post(srv.port(), "/v1/completions", std::string(9 << 20, ' '));
  expect_error_shape(r, 413, "request_too_large", nullptr, "9 MiB body");
  // A body just under the limit is read and parsed (and is bad JSON).
  std::string big = "{\"prompt\": [" + std::string(7 << 20, ' ');
  r = http_post(srv.port(), "/v1/completions", big);
  expect_error_shape(r, 400, "invalid_json", nullptr, "7 MiB body");

  std::string reply = raw_exchange(srv.port(), "GARBAGE\r\n\r\n", 3.0);
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  // Invalid UTF-8 through a raw socket too.
  reply = raw_exchange(srv.port(),
                       http_request_text("POST", "/v1/completions", "{\"prompt\": \"\xc3\x28\"}"));
  EXPECT_EQ(reply.rfind("HTTP/1.1 400", 0), 0u) << reply;
  EXPECT_NE(reply.find("invalid_utf8"), std::string::npos) << reply;

  HttpResult ok = post_json(srv.port(), "/v1/completions", completion_body({1, 2, 3}, 2));
  EXPECT_EQ(ok.status, 200) << ok.raw;
}

}  // namespace
