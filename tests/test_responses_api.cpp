// The OpenAI Responses API (POST /v1/responses, stateless) over the chat
// pipeline: the response object, the event stream checked event by event
// (types, sequence numbers, output indexes, that the deltas add up to the
// non-stream output), reasoning and function_call items (the tiny Gemma 4
// with its output forced, as in test_server_tools), the function-call round
// trip, errors, and images on the vision lane.
#include <gtest/gtest.h>

#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

json tools() {
  return json::parse(R"([{"type": "function", "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}])");
}

json openai_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}])");
}

int chat_prompt_tokens(int port, const json& messages, const json& tools = nullptr) {
  json body = {{"messages", messages}, {"max_tokens", 1}};
  if (!tools.is_null()) body["tools"] = tools;
  HttpResult r = post_json(port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.body["usage"]["prompt_tokens"].get<int>();
}

// Checks the stream against the documented sequence; returns the final
// response (from response.completed / .incomplete) after checking that the
// items and text the events built equal it.
json check_stream(const std::vector<NamedEvent>& events) {
  EXPECT_GE(events.size(), 3u);
  json items = json::array();  // built from the events
  int open = -1;
  json final_response;
  for (size_t i = 0; i < events.size(); ++i) {
    const NamedEvent& e = events[i];
    SCOPED_TRACE("event " + std::to_string(i) + ": " + e.name + " " + e.data.dump());
    EXPECT_EQ(e.data["type"], e.name);
    EXPECT_EQ(e.data["sequence_number"], int(i));
    EXPECT_TRUE(final_response.is_null()) << "an event after the final one";
    if (i == 0) {
      EXPECT_EQ(e.name, "response.created");
      EXPECT_EQ(e.data["response"]["status"], "in_progress");
      EXPECT_EQ(e.data["response"]["output"], json::array());
      continue;
    }
    if (e.name == "response.in_progress") {
      EXPECT_EQ(i, 1u);
    } else if (e.name == "response.output_item.added") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(e.data["output_index"], items.size());
      open = int(items.size());
      items.push_back(e.data["item"]);
    } else if (e.name == "response.content_part.added") {
      EXPECT_EQ(e.data["output_index"], open);
      EXPECT_EQ(e.data["content_index"], 0);
      EXPECT_EQ(e.data["item_id"], items[size_t(open)]["id"]);
      items[size_t(open)]["content"].push_back(e.data["part"]);
    } else if (e.name == "response.output_text.delta" ||
               e.name == "response.reasoning_text.delta") {
      EXPECT_EQ(e.data["output_index"], open);
      EXPECT_EQ(e.data["item_id"], items[size_t(open)]["id"]);
      json& part = items[size_t(open)]["content"][0];
      part["text"] = part["text"].get<std::string>() + e.data["delta"].get<std::string>();
    } else if (e.name == "response.output_text.done" || e.name == "response.reasoning_text.done") {
      EXPECT_EQ(e.data["text"], items[size_t(open)]["content"][0]["text"]);
    } else if (e.name == "response.content_part.done") {
      EXPECT_EQ(e.data["part"], items[size_t(open)]["content"][0]);
    } else if (e.name == "response.function_call_arguments.delta") {
      EXPECT_EQ(e.data["output_index"], open);
      json& item = items[size_t(open)];
      item["arguments"] = item["arguments"].get<std::string>() + e.data["delta"].get<std::string>();
    } else if (e.name == "response.function_call_arguments.done") {
      EXPECT_EQ(e.data["arguments"], items[size_t(open)]["arguments"]);
    } else if (e.name == "response.output_item.done") {
      EXPECT_EQ(e.data["output_index"], open);
      json built = items[size_t(open)];
      built["status"] = e.data["item"].value("status", json(nullptr));
      if (!e.data["item"].contains("status")) built.erase("status");
      EXPECT_EQ(e.data["item"], built);
      items[size_t(open)] = e.data["item"];
      open = -1;
    } else if (e.name == "response.completed" || e.name == "response.incomplete") {
      EXPECT_EQ(open, -1);
      final_response = e.data["response"];
      EXPECT_EQ(final_response["output"], items);
    } else {
      ADD_FAILURE() << "unexpected event " << e.name;
    }
  }
  EXPECT_FALSE(final_response.is_null());
  return final_response;
}

// Output items without their random ids, to compare two responses.
json without_ids(json output) {
  for (json& item : output) {
    item.erase("id");
    item.erase("call_id");
  }
  return output;
}

TEST(ResponsesApi, TextResponseAndItsStream) {
  ForcedServer s("Hello! How can I help?");
  json body = {{"model", "test-model"}, {"input", "Hi"}, {"instructions", "Be brief."}};
  HttpResult r = post_json(s.port(), "/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& o = r.body;
  EXPECT_EQ(o["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(o["object"], "response");
  EXPECT_EQ(o["status"], "completed");
  EXPECT_EQ(o["model"], "test-model");
  EXPECT_EQ(o["instructions"], "Be brief.");
  ASSERT_EQ(o["output"].size(), 1u) << o;
  const json& msg = o["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(msg["content"],
            json::parse(R"([{"type": "output_text", "text": "Hello! How can I help?",
                                             "annotations": []}])"));
  const int prompt =
      chat_prompt_tokens(s.port(), json::parse(R"([{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"}])"));
  EXPECT_EQ(o["usage"]["input_tokens"], prompt);
  EXPECT_GT(o["usage"]["output_tokens"], 0);
  EXPECT_EQ(o["usage"]["total_tokens"],
            o["usage"]["input_tokens"].get<int>() + o["usage"]["output_tokens"].get<int>());

  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/responses", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  const std::vector<NamedEvent> events = named_events(st.raw);
  const json fin = check_stream(events);
  EXPECT_EQ(events.back().name, "response.completed");
  EXPECT_EQ(fin["status"], "completed");
  EXPECT_EQ(without_ids(fin["output"]), without_ids(o["output"]));
  // The same prompt again: its whole 16-token blocks come from the prefix
  // cache; the rest of the usage is the same.
  json usage = fin["usage"];
  EXPECT_EQ(usage["input_tokens_details"]["cached_tokens"], (prompt - 1) / 16 * 16);
  EXPECT_EQ(o["usage"]["input_tokens_details"]["cached_tokens"], 0);
  usage["input_tokens_details"]["cached_tokens"] = 0;
  EXPECT_EQ(usage, o["usage"]);
  std::vector<std::string> order;
  for (const NamedEvent& e : events)
    if (order.empty() || order.back() != e.name) order.push_back(e.name);
  EXPECT_EQ(order, (std::vector<std::string>{
                       "response.created", "response.in_progress", "response.output_item.added",
                       "response.content_part.added", "response.output_text.delta",
                       "response.output_text.done", "response.content_part.done",
                       "response.output_item.done", "response.completed"}));
}

TEST(ResponsesApi, ReasoningAndFunctionCallItems) {
  ForcedServer s(
      "<|channel>thought\nThe user wants the weather in Paris.<channel|>"
      "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
      "<|tool_response>response:get_weather{temperature:20}<tool_response|>");
  json body = {{"input", "What's the weather in Paris?"},
               {"tools", tools()},
               {"reasoning", {{"effort", "medium"}}}};
  HttpResult r = post_json(s.port(), "/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& out = r.body["output"];
  ASSERT_EQ(out.size(), 2u) << r.raw;
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["content"][0],
            json({{"type", "reasoning_text"}, {"text", "The user wants the weather in Paris."}}));
  EXPECT_EQ(out[1]["type"], "function_call");
  EXPECT_EQ(out[1]["name"], "get_weather");
  EXPECT_EQ(json::parse(out[1]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(out[1]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(out[1]["status"], "completed");
  EXPECT_EQ(r.body["status"], "completed");
  EXPECT_EQ(r.body["tools"], tools());

  json chat = {
      {"messages", json::array({{{"role", "user"}, {"content", "What's the weather in Paris?"}}})},
      {"tools", openai_tools()},
      {"enable_thinking", true},
      {"max_tokens", 1}};
  HttpResult cr = post_json(s.port(), "/v1/chat/completions", chat);
  EXPECT_EQ(r.body["usage"]["input_tokens"], cr.body["usage"]["prompt_tokens"]);

  body["stream"] = true;
  const json fin = check_stream(named_events(post_stream(s.port(), "/v1/responses", body).raw));
  EXPECT_EQ(without_ids(fin["output"]), without_ids(out));
}

TEST(ResponsesApi, FunctionCallRoundTripAndIncomplete) {
  ForcedServer s("Sunny.");
  const json input = json::parse(R"([
    {"role": "user", "content": [{"type": "input_text", "text": "What's the weather in Paris?"}]},
    {"type": "function_call", "call_id": "call_abc123", "name": "get_weather",
     "arguments": "{\"city\": \"Paris\"}"},
    {"type": "function_call_output", "call_id": "call_abc123", "output": "20 C"}])");
  const json openai = json::parse(R"([
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc123", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "20 C"}])");
  HttpResult r =
      post_json(s.port(), "/v1/responses", {{"input", input}, {"tools", tools()}, {"store", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["output"][0]["content"][0]["text"], "Sunny.");
  EXPECT_EQ(r.body["usage"]["input_tokens"], chat_prompt_tokens(s.port(), openai, openai_tools()));

  json cut = {{"input", "Hi"}, {"max_output_tokens", 2}};
  r = post_json(s.port(), "/v1/responses", cut);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["status"], "incomplete");
  EXPECT_EQ(r.body["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r.body["usage"]["output_tokens"], 2);
  cut["stream"] = true;
  const std::vector<NamedEvent> events =
      named_events(post_stream(s.port(), "/v1/responses", cut).raw);
  const json fin = check_stream(events);
  EXPECT_EQ(events.back().name, "response.incomplete");
  EXPECT_EQ(fin["incomplete_details"]["reason"], "max_output_tokens");
}

TEST(ResponsesApi, Errors) {
  ForcedServer s("Hello");
  const char* bad_bodies[] = {
      R"({"input": "Hi", "previous_response_id": "resp_123"})",
      R"({})",
      R"({"input": 5})",
      R"({"input": []})",
      R"({"input": [{"type": "file_search_call", "id": "x"}]})",
      R"({"input": [{"role": "user", "content": [{"type": "input_audio", "data": "x"}]}]})",
      R"({"input": [{"role": "wizard", "content": "x"}]})",
      R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})",
      R"({"input": "Hi", "tools": [{"type": "web_search"}]})",
      R"({"input": "Hi", "max_output_tokens": 0})",
      R"({"input": "Hi", "temperature": "hot"})",
      R"({"input": "Hi", "text": {"format": {"type": "json_schema"}}})",
  };
  for (const char* bad : bad_bodies) {
    SCOPED_TRACE(bad);
    HttpResult r = http_post(s.port(), "/v1/responses", bad);
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error") << r.raw;
    EXPECT_TRUE(r.body["error"].contains("code")) << r.raw;
  }
  HttpResult r = http_post(s.port(), "/v1/responses", bad_bodies[0]);
  EXPECT_EQ(r.body["error"]["param"], "previous_response_id");
  r = post_json(s.port(), "/v1/responses", {{"input", "Hi"}, {"model", "gpt-5"}});
  EXPECT_EQ(r.status, 404) << r.raw;
  EXPECT_EQ(r.body["error"]["code"], "model_not_found");
}

TEST(ResponsesApi, InputImageUsesTheVisionLane) {
  ChildServer srv({vision_model_dir("gemma4"), "--threads", "1"},
                  {"TANDEM_FORCE_OUTPUT=A small picture."});
  ASSERT_TRUE(srv.ready()) << srv.log();
  const std::string url =
      "data:image/png;base64," + base64(file_bytes(vision_fixture_dir("gemma4") + "/input_0.png"));
  json body = {
      {"input",
       json::array(
           {{{"role", "user"},
             {"content", json::array({{{"type", "input_image"}, {"image_url", url}},
                                      {{"type", "input_text"}, {"text", "What is it?"}}})}}})}};
  HttpResult r = post_json(srv.port(), "/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["output"][0]["content"][0]["text"], "A small picture.");
  EXPECT_GT(r.body["usage"]["input_tokens"].get<int>(), 50);
  body["stream"] = true;
  const json fin = check_stream(named_events(post_stream(srv.port(), "/v1/responses", body).raw));
  EXPECT_EQ(without_ids(fin["output"]), without_ids(r.body["output"]));
  EXPECT_EQ(http_get(srv.port(), "/v1/status").body["vision_lane_requests"], 2);
}

// A failure after the first token ends the stream with response.failed.
TEST(ResponsesApi, FailureMidStreamIsResponseFailed) {
  ForcedServer s("Hello! How can I help you today?", "step-throw@4");
  SseResult st = post_stream(s.port(), "/v1/responses", {{"input", "Hi"}, {"stream", true}});
  ASSERT_EQ(st.status, 200) << st.raw;
  const std::vector<NamedEvent> events = named_events(st.raw);
  ASSERT_GE(events.size(), 4u) << st.raw;
  EXPECT_EQ(events[events.size() - 2].name, "response.output_item.done") << st.raw;
  const NamedEvent& last = events.back();
  EXPECT_EQ(last.name, "response.failed");
  EXPECT_EQ(last.data["response"]["status"], "failed");
  EXPECT_EQ(last.data["response"]["error"]["code"], "server_error");
  EXPECT_EQ(last.data["sequence_number"], int(events.size()) - 1);
}

}  // namespace
