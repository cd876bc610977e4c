// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// over the chat pipeline: the non-stream message, the event stream checked
// event by event against Anthropic's documented sequence, errors in
// Anthropic's shape, thinking and tool_use blocks (the tiny Gemma 4 with its
// real tokenizer and template, its output forced as in test_server_tools),
// the tool round trip, count_tokens against the chat path, and images on
// the vision lane.
#include <gtest/gtest.h>

#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

const char* kGemmaCall =
    "<|channel>thought\nThe user wants the weather in Paris.<channel|>"
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
    "<|tool_response>response:get_weather{temperature:20}<tool_response|>";

json weather_tool() {
  return json::parse(R"([{"name": "get_weather", "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}])");
}

json openai_weather_tool() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}])");
}

json messages_body(const std::string& text, int max_tokens = 256) {
  return {{"model", "test-model"},
          {"max_tokens", max_tokens},
          {"messages", json::array({{{"role", "user"}, {"content", text}}})}};
}

// The chat path's prompt_tokens for `messages` (and tools).
int chat_prompt_tokens(int port, const json& messages, const json& tools = nullptr) {
  json body = {{"messages", messages}, {"max_tokens", 1}};
  if (!tools.is_null()) body["tools"] = tools;
  HttpResult r = post_json(port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.body["usage"]["prompt_tokens"].get<int>();
}

void expect_anthropic_error(const HttpResult& r, int status, const std::string& type) {
  EXPECT_EQ(r.status, status) << r.raw;
  EXPECT_EQ(r.body["type"], "error") << r.raw;
  EXPECT_EQ(r.body["error"]["type"], type) << r.raw;
  EXPECT_TRUE(r.body["error"]["message"].is_string()) << r.raw;
}

// Checks a stream's structure against the documented sequence and returns
// the message it describes, put together as the SDKs do.
json check_stream(const std::vector<NamedEvent>& events) {
  EXPECT_GE(events.size(), 3u);
  json msg;
  int open = -1, next = 0;
  bool delta_seen = false, stopped = false;
  for (size_t i = 0; i < events.size(); ++i) {
    const NamedEvent& e = events[i];
    SCOPED_TRACE("event " + std::to_string(i) + ": " + e.name + " " + e.data.dump());
    EXPECT_FALSE(stopped) << "an event after message_stop";
    EXPECT_EQ(e.data["type"], e.name);
    if (i == 0) {
      EXPECT_EQ(e.name, "message_start");
      msg = e.data["message"];
      EXPECT_EQ(msg["content"], json::array());
      EXPECT_TRUE(msg["stop_reason"].is_null());
      EXPECT_EQ(msg["usage"]["output_tokens"], 0);
      continue;
    }
    if (e.name == "ping") continue;
    if (e.name == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(e.data["index"], next);
      open = next++;
      msg["content"].push_back(e.data["content_block"]);
      if (msg["content"].back()["type"] == "tool_use") msg["content"].back()["partial"] = "";
    } else if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"], open);
      json& b = msg["content"][size_t(open)];
      const json& d = e.data["delta"];
      if (d["type"] == "text_delta") {
        EXPECT_EQ(b["type"], "text");
        b["text"] = b["text"].get<std::string>() + d["text"].get<std::string>();
      } else if (d["type"] == "thinking_delta") {
        EXPECT_EQ(b["type"], "thinking");
        b["thinking"] = b["thinking"].get<std::string>() + d["thinking"].get<std::string>();
      } else {
        EXPECT_EQ(d["type"], "input_json_delta");
        EXPECT_EQ(b["type"], "tool_use");
        b["partial"] = b["partial"].get<std::string>() + d["partial_json"].get<std::string>();
      }
    } else if (e.name == "content_block_stop") {
      EXPECT_EQ(e.data["index"], open);
      json& b = msg["content"][size_t(open)];
      if (b["type"] == "tool_use") {
        b["input"] = json::parse(b["partial"].get<std::string>());
        b.erase("partial");
      }
      open = -1;
    } else if (e.name == "message_delta") {
      EXPECT_EQ(open, -1) << "message_delta with a block open";
      EXPECT_FALSE(delta_seen);
      delta_seen = true;
      msg["stop_reason"] = e.data["delta"]["stop_reason"];
      msg["stop_sequence"] = e.data["delta"]["stop_sequence"];
      msg["usage"]["output_tokens"] = e.data["usage"]["output_tokens"];
    } else if (e.name == "message_stop") {
      EXPECT_TRUE(delta_seen);
      stopped = true;
    } else {
      ADD_FAILURE() << "unexpected event " << e.name;
    }
  }
  EXPECT_TRUE(stopped);
  return msg;
}

TEST(AnthropicApi, TextMessageAndItsStream) {
  ForcedServer s("Hello! How can I help?");
  HttpResult r = post_json(s.port(), "/v1/messages", messages_body("Hi"));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& m = r.body;
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "test-model");
  EXPECT_EQ(m["content"], json::parse(R"([{"type": "text", "text": "Hello! How can I help?"}])"));
  EXPECT_EQ(m["stop_reason"], "end_turn");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  EXPECT_EQ(m["usage"]["input_tokens"],
            chat_prompt_tokens(s.port(), json::array({{{"role", "user"}, {"content", "Hi"}}})));
  EXPECT_GT(m["usage"]["output_tokens"], 0);

  json body = messages_body("Hi");
  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/messages", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  EXPECT_EQ(std::string(httplib::detail::get_header_value(st.headers, "Content-Type", 0, "")),
            "text/event-stream");
  const std::vector<NamedEvent> events = named_events(st.raw);
  const json got = check_stream(events);
  EXPECT_EQ(got["content"], m["content"]);
  EXPECT_EQ(got["stop_reason"], "end_turn");
  EXPECT_EQ(got["usage"]["input_tokens"], m["usage"]["input_tokens"]);
  EXPECT_EQ(got["usage"]["output_tokens"], m["usage"]["output_tokens"]);
  // The text arrived over several deltas.
  int deltas = 0;
  for (const NamedEvent& e : events) deltas += e.name == "content_block_delta";
  EXPECT_GT(deltas, 1);
  EXPECT_EQ(events.front().name, "message_start");
  EXPECT_EQ(events.back().name, "message_stop");
}

TEST(AnthropicApi, StopSequenceAndMaxTokens) {
  ForcedServer s("Hello there. STOP and more text");
  json body = messages_body("Hi");
  body["stop_sequences"] = {"STOP"};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    json m;
    if (stream) {
      m = check_stream(named_events(post_stream(s.port(), "/v1/messages", body).raw));
    } else {
      HttpResult r = post_json(s.port(), "/v1/messages", body);
      ASSERT_EQ(r.status, 200) << r.raw;
      m = r.body;
    }
    EXPECT_EQ(m["stop_reason"], "stop_sequence") << m;
    EXPECT_EQ(m["stop_sequence"], "STOP") << m;
    EXPECT_EQ(m["content"][0]["text"], "Hello there. ") << m;
  }
  HttpResult r = post_json(s.port(), "/v1/messages", messages_body("Hi", 2));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["stop_reason"], "max_tokens");
  EXPECT_EQ(r.body["usage"]["output_tokens"], 2);
}

TEST(AnthropicApi, ThinkingAndToolUseBlocks) {
  ForcedServer s(kGemmaCall);
  json body = messages_body("What's the weather in Paris?");
  body["tools"] = weather_tool();
  body["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  HttpResult r = post_json(s.port(), "/v1/messages", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& c = r.body["content"];
  ASSERT_EQ(c.size(), 2u) << r.raw;
  EXPECT_EQ(c[0]["type"], "thinking");
  EXPECT_EQ(c[0]["thinking"], "The user wants the weather in Paris.");
  EXPECT_EQ(c[1]["type"], "tool_use");
  const std::string id = c[1]["id"];
  EXPECT_EQ(id.rfind("toolu_", 0), 0u);
  EXPECT_EQ(id.size(), 30u);
  EXPECT_EQ(c[1]["name"], "get_weather");
  EXPECT_EQ(c[1]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(r.body["stop_reason"], "tool_use");
  EXPECT_TRUE(r.body["stop_sequence"].is_null());

  // The same prompt as the chat path with the same tools and thinking on.
  json chat = {{"messages", body["messages"]},
               {"tools", openai_weather_tool()},
               {"max_tokens", 1},
               {"enable_thinking", true}};
  HttpResult cr = post_json(s.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(cr.status, 200) << cr.raw;
  EXPECT_EQ(r.body["usage"]["input_tokens"], cr.body["usage"]["prompt_tokens"]);

  body["stream"] = true;
  const std::vector<NamedEvent> events =
      named_events(post_stream(s.port(), "/v1/messages", body).raw);
  json got = check_stream(events);
  ASSERT_EQ(got["content"].size(), 2u) << got;
  EXPECT_EQ(got["content"][0]["thinking"], c[0]["thinking"]);
  EXPECT_EQ(got["content"][1]["input"], c[1]["input"]);
  EXPECT_EQ(got["content"][1]["name"], "get_weather");
  EXPECT_EQ(got["content"][1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(got["stop_reason"], "tool_use");
  // The block starts carry their type's empty fields.
  for (const NamedEvent& e : events)
    if (e.name == "content_block_start") {
      const json& b = e.data["content_block"];
      if (b["type"] == "thinking") {
        EXPECT_EQ(b["thinking"], "");
      }
      if (b["type"] == "tool_use") {
        EXPECT_EQ(b["input"], json::object());
      }
    }
}

TEST(AnthropicApi, ToolRoundTripAndCountTokens) {
  ForcedServer s("Sunny.");
  const json anthropic = json::parse(R"([
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": [
      {"type": "tool_use", "id": "toolu_abc123", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_abc123",
       "content": [{"type": "text", "text": "20 C"}]}]}])");
  const json openai = json::parse(R"([
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_abc123", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "toolu_abc123", "content": "20 C"}])");
  json body = {{"model", "test-model"},
               {"max_tokens", 64},
               {"tools", weather_tool()},
               {"messages", anthropic}};
  HttpResult r = post_json(s.port(), "/v1/messages", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["content"][0]["text"], "Sunny.");
  const int chat_tokens = chat_prompt_tokens(s.port(), openai, openai_weather_tool());
  EXPECT_EQ(r.body["usage"]["input_tokens"], chat_tokens);

  body.erase("max_tokens");  // not required by count_tokens
  HttpResult c = post_json(s.port(), "/v1/messages/count_tokens", body);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body, json({{"input_tokens", chat_tokens}}));

  // A system prompt (string or text blocks) is the chat path's system message.
  json sys = messages_body("Hi");
  sys.erase("max_tokens");
  sys["system"] = json::array({{{"type", "text"}, {"text", "Be brief."}}});
  c = post_json(s.port(), "/v1/messages/count_tokens", sys);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["input_tokens"],
            chat_prompt_tokens(s.port(), json::parse(R"([{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "Hi"}])")));
  sys["system"] = "Be brief.";
  EXPECT_EQ(post_json(s.port(), "/v1/messages/count_tokens", sys).body, c.body);
}

TEST(AnthropicApi, ErrorsInAnthropicShape) {
  server::ServerOptions o;
  o.api_key = "sekret";
  ForcedOutput fo;
  fo.options = o;
  ForcedServer s("Hello", fo);
  const httplib::Headers key = {{"x-api-key", "sekret"}};
  auto post = [&](const json& b, const std::string& path = "/v1/messages") {
    return post_json(s.port(), path, b, key);
  };
  // The key: x-api-key (and Bearer) accepted; none is authentication_error.
  EXPECT_EQ(post(messages_body("Hi")).status, 200);
  EXPECT_EQ(
      post_json(s.port(), "/v1/messages", messages_body("Hi"), {{"Authorization", "Bearer sekret"}})
          .status,
      200);
  expect_anthropic_error(post_json(s.port(), "/v1/messages", messages_body("Hi")), 401,
                         "authentication_error");

  json b = messages_body("Hi");
  b.erase("max_tokens");
  HttpResult r = post(b);
  expect_anthropic_error(r, 400, "invalid_request_error");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);

  const char* bad_bodies[] = {
      // an unknown block type, a user block only assistants send, a bad role
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]})",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})",
      R"({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]})",
      R"({"max_tokens": 8, "messages": []})",
      R"({"max_tokens": 8})",
      R"({"max_tokens": "8", "messages": [{"role": "user", "content": "x"}]})",
      R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}})",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]})",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "maybe"}})",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "x"}}]}]})",
      R"({"max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": [1]}]}]})",
      R"([1, 2])",
      R"({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "temperature": 7})",
  };
  for (const char* bad : bad_bodies) {
    SCOPED_TRACE(bad);
    expect_anthropic_error(http_post(s.port(), "/v1/messages", bad, key), 400,
                           "invalid_request_error");
  }
  expect_anthropic_error(http_post(s.port(), "/v1/messages", "{not json", key), 400,
                         "invalid_request_error");
  // count_tokens validates the same body.
  expect_anthropic_error(http_post(s.port(), "/v1/messages/count_tokens", bad_bodies[0], key), 400,
                         "invalid_request_error");

  b = messages_body("Hi");
  b["model"] = "claude-opus-4";
  expect_anthropic_error(post(b), 404, "not_found_error");
  expect_anthropic_error(http_get(s.port(), "/v1/messages", key), 405, "invalid_request_error");
  // The OpenAI routes keep their own shape.
  HttpResult o1 = post_json(s.port(), "/v1/chat/completions", json::object(), key);
  EXPECT_EQ(o1.status, 400);
  EXPECT_TRUE(o1.body["error"].contains("code")) << o1.raw;
}

// An image block (base64 data) takes the vision lane, as an image_url part
// does on the chat path; a URL source needs --allow-image-urls.
TEST(AnthropicApi, ImageBlocksUseTheVisionLane) {
  ChildServer srv({vision_model_dir("gemma4"), "--threads", "1"},
                  {"TANDEM_FORCE_OUTPUT=A small picture."});
  ASSERT_TRUE(srv.ready()) << srv.log();
  const std::string data = base64(file_bytes(vision_fixture_dir("gemma4") + "/input_0.png"));
  json body = {
      {"max_tokens", 16},
      {"messages",
       json::array(
           {{{"role", "user"},
             {"content",
              json::array(
                  {{{"type", "image"},
                    {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", data}}}},
                   {{"type", "text"}, {"text", "What is it?"}}})}}})}};
  HttpResult r = post_json(srv.port(), "/v1/messages", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["content"][0]["text"], "A small picture.");
  body["stream"] = true;
  const json got = check_stream(named_events(post_stream(srv.port(), "/v1/messages", body).raw));
  EXPECT_EQ(got["content"], r.body["content"]);
  EXPECT_EQ(http_get(srv.port(), "/v1/status").body["vision_lane_requests"], 2);

  // count_tokens counts the image's soft tokens, as the chat path does.
  json chat = {
      {"max_tokens", 1},
      {"messages",
       json::array(
           {{{"role", "user"},
             {"content", json::array({{{"type", "image_url"},
                                       {"image_url", {{"url", "data:image/png;base64," + data}}}},
                                      {{"type", "text"}, {"text", "What is it?"}}})}}})}};
  HttpResult cr = post_json(srv.port(), "/v1/chat/completions", chat);
  ASSERT_EQ(cr.status, 200) << cr.raw;
  body.erase("stream");
  HttpResult c = post_json(srv.port(), "/v1/messages/count_tokens", body);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["input_tokens"], cr.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(c.body["input_tokens"], r.body["usage"]["input_tokens"]);
  EXPECT_GT(c.body["input_tokens"].get<int>(), 50);

  body["messages"][0]["content"][0]["source"] = {{"type", "url"},
                                                 {"url", "http://127.0.0.1:9/x.png"}};
  HttpResult u = post_json(srv.port(), "/v1/messages", body);
  expect_anthropic_error(u, 400, "invalid_request_error");
  EXPECT_NE(u.body["error"]["message"].get<std::string>().find("--allow-image-urls"),
            std::string::npos);
}

// A failure after the first token: the open block is closed and the stream
// ends with an `error` event in Anthropic's shape.
TEST(AnthropicApi, FailureMidStreamIsAnErrorEvent) {
  ForcedServer s("Hello! How can I help you today?", "step-throw@4");
  json body = messages_body("Hi");
  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/messages", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  const std::vector<NamedEvent> events = named_events(st.raw);
  ASSERT_GE(events.size(), 4u) << st.raw;
  EXPECT_EQ(events[0].name, "message_start");
  EXPECT_EQ(events[events.size() - 2].name, "content_block_stop") << st.raw;
  const NamedEvent& last = events.back();
  EXPECT_EQ(last.name, "error");
  EXPECT_EQ(last.data["type"], "error");
  EXPECT_EQ(last.data["error"]["type"], "api_error");
  for (const NamedEvent& e : events) EXPECT_NE(e.name, "message_stop");
}

}  // namespace
