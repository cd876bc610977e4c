// Tool calls and reasoning through the server: request fields (tools,
// tool_choice, parallel_tool_calls, enable_thinking, --no-thinking), the
// prompt the real templates render for tool calls and results, and the
// response shapes (message.reasoning_content, message.tool_calls,
// finish_reason "tool_calls", stream deltas).
//
// The tiny models' words are noise, so their output is forced: with
// EngineConfig::forced_output (TANDEM_FORCE_OUTPUT for `tandem serve`) the
// engine generates the ids of a recorded output in each family's format,
// and everything after — detokenization with the marker tokens kept, stop
// strings, parsing, the wire — is the real path. Tests that need chunk
// boundaries in chosen places use a scripted text stream instead.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"

using namespace tandem;
using namespace tandem::test;

namespace {

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}])");
}

json user(const std::string& text) {
  return json::array({{{"role", "user"}, {"content", text}}});
}

// Ministral 3's template writes a long default system prompt: too long for
// the tiny model's 256-token context with its small tokenizer.
json system_user(const std::string& text) {
  return json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", text}}});
}

json chat(json messages, json tools = nullptr) {
  json b = {{"messages", std::move(messages)}, {"max_tokens", 256}, {"temperature", 0}};
  if (!tools.is_null()) b["tools"] = std::move(tools);
  return b;
}

// What a stream carried, put together as the SDKs do.
struct Streamed {
  std::string reasoning, content, finish;
  json calls = json::array();  // [{id, name, arguments}] merged by index
  bool saw_marker = false;     // a delta's content held a marker token's text
};

Streamed collect(const SseResult& s) {
  Streamed out;
  for (const json& e : s.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c["finish_reason"].is_string()) out.finish = c["finish_reason"];
    const json& d = c["delta"];
    if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content") && d["content"].is_string()) {
      const std::string piece = d["content"];
      out.content += piece;
      for (const char* m : {"<|channel>", "<channel|>", "<|tool_call>", "[TOOL_CALLS]", "<think>"})
        out.saw_marker = out.saw_marker || piece.find(m) != std::string::npos;
    }
    if (d.contains("tool_calls"))
      for (const json& t : d["tool_calls"]) {
        const size_t i = t["index"];
        while (out.calls.size() <= i) out.calls.push_back({{"arguments", ""}});
        json& call = out.calls[i];
        if (t.contains("id")) call["id"] = t["id"];
        if (t.contains("type")) call["type"] = t["type"];
        if (t["function"].contains("name")) call["name"] = t["function"]["name"];
        call["arguments"] =
            call["arguments"].get<std::string>() + t["function"].value("arguments", "");
      }
  }
  return out;
}

// The shared ForcedServer (test_server_util.h) over the model folder `dir`.
ForcedServer forced(const std::string& dir, const std::string& output,
                    server::ServerOptions options = {}) {
  ForcedOutput o;
  o.model_dir = dir;
  o.options = options;
  return ForcedServer(output, o);
}

// Gemma 4 with thinking on, calling a tool: its channel, its call tokens,
// then <|tool_response> and an imagined answer (which the server's stop
// string must cut).
const char* kGemmaCall =
    "<|channel>thought\nThe user wants the weather in Paris.<channel|>"
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"
    "<|tool_response>response:get_weather{temperature:20}<tool_response|>";

TEST(ServerTools, Gemma4CallWithReasoningStreamAndNonStream) {
  ForcedServer s = forced(vision_model_dir("gemma4"), kGemmaCall);
  json body = chat(user("What's the weather in Paris?"), weather_tools());
  body["chat_template_kwargs"] = {{"enable_thinking", true}};
  HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  const json& m = choice["message"];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(m["content"].is_null()) << m;
  EXPECT_EQ(m["reasoning_content"], "The user wants the weather in Paris.");
  ASSERT_EQ(m["tool_calls"].size(), 1u) << m;
  const json& call = m["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["id"].get<std::string>().size(), 29u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));

  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  ASSERT_TRUE(st.done);
  Streamed got = collect(st);
  EXPECT_EQ(got.finish, "tool_calls");
  EXPECT_EQ(got.reasoning, m["reasoning_content"]);
  EXPECT_EQ(got.content, "");
  EXPECT_FALSE(got.saw_marker);
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0]["name"], "get_weather");
  EXPECT_EQ(got.calls[0]["type"], "function");
  EXPECT_EQ(got.calls[0]["arguments"], call["function"]["arguments"]);
  EXPECT_EQ(st.ids(), choice["token_ids"].get<std::vector<int32_t>>());
  // The reasoning streamed ahead of the call, over several chunks.
  int reasoning_chunks = 0;
  for (const json& e : st.events)
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("reasoning_content"))
      ++reasoning_chunks;
  EXPECT_GT(reasoning_chunks, 1);
}

TEST(ServerTools, Gemma4ReasoningWithoutToolsAndToolChoiceNone) {
  ForcedServer s = forced(vision_model_dir("gemma4"),
                          "<|channel>thought\nA greeting.<channel|>Hello! How can I help?");
  HttpResult r = post_json(s.port(), "/v1/chat/completions", chat(user("Hi")));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["reasoning_content"], "A greeting.");
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "Hello! How can I help?");
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");

  // tool_choice "none": the template gets no tools (the same prompt as
  // without them) and calls are not parsed.
  ForcedServer c = forced(vision_model_dir("gemma4"), kGemmaCall);
  json none = chat(user("Weather in Paris?"), weather_tools());
  none["tool_choice"] = "none";
  HttpResult a = post_json(c.port(), "/v1/chat/completions", none);
  HttpResult b = post_json(c.port(), "/v1/chat/completions", chat(user("Weather in Paris?")));
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(a.body["usage"]["prompt_tokens"], b.body["usage"]["prompt_tokens"]);
  EXPECT_FALSE(a.body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(a.body["choices"][0]["finish_reason"], "stop");
  // With tools (auto) the prompt declares them.
  HttpResult t =
      post_json(c.port(), "/v1/chat/completions", chat(user("Weather in Paris?"), weather_tools()));
  ASSERT_EQ(t.status, 200) << t.raw;
  EXPECT_GT(t.body["usage"]["prompt_tokens"], b.body["usage"]["prompt_tokens"]);
}

// A conversation after a call: the assistant's tool_calls (arguments as the
// OpenAI JSON string) and the tool's result, as each real template renders
// them, and accepted over HTTP.
json round_trip_messages() {
  return json::parse(R"([
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc123", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": [{"type": "text", "text": "20 C"}]}])");
}

std::string rendered(server::ModelText& text, const json& messages, const json& tools) {
  return text.tokenizer().decode(text.chat_prompt(messages, tools, nullptr));
}

TEST(ServerTools, ToolResultsRenderThroughTheRealTemplates) {
  auto gemma = server::ModelText::load(vision_model_dir("gemma4"));
  EXPECT_NE(rendered(*gemma, round_trip_messages(), weather_tools())
                .find("<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
                      "<tool_call|><|tool_response>response:get_weather{value:<|\"|>20 C<|\"|>}"
                      "<tool_response|>"),
            std::string::npos)
      << rendered(*gemma, round_trip_messages(), weather_tools());
  auto mistral = server::ModelText::load(vision_model_dir("mistral3"));
  EXPECT_NE(
      rendered(*mistral, round_trip_messages(), weather_tools())
          .find("[/INST][TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}</s>[TOOL_RESULTS]20 "
                "C[/TOOL_RESULTS]"),
      std::string::npos)
      << rendered(*mistral, round_trip_messages(), weather_tools());

  // Llama 3.2's template prints the arguments object with tojson (a string
  // would come out quoted) and the result as JSON text.
  const char* home = std::getenv("HOME");
  const std::string llama_tok =
      std::string(home ? home : "/root") + "/.cache/tandem/tokenizers/llama3_1";
  if (std::filesystem::exists(llama_tok + "/tokenizer.json")) {
    TempDir dir;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(llama_tok + "/" + f, dir.path() + "/" + f);
    std::filesystem::copy_file(
        source_dir() + "/tests/fixtures/templates/llama3_2/chat_template.jinja",
        dir.path() + "/chat_template.jinja");
    auto llama = server::ModelText::load(dir.path());
    EXPECT_EQ(llama->chat_format().tools, text::ToolCallFormat::Llama3Json);
    EXPECT_NE(rendered(*llama, round_trip_messages(), weather_tools())
                  .find("<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
                        "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                        "<|start_header_id|>ipython<|end_header_id|>\n\n\"20 C\"<|eot_id|>"),
              std::string::npos)
        << rendered(*llama, round_trip_messages(), weather_tools());
  }

  // (Without the tools' declarations: the tiny model's context is 256 tokens.)
  ForcedServer s = forced(vision_model_dir("gemma4"), "It is 20 C in Paris.");
  HttpResult r = post_json(s.port(), "/v1/chat/completions", chat(round_trip_messages()));
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "It is 20 C in Paris.");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
}

TEST(ServerTools, MistralCallsAndMalformedCallsAsContent) {
  ForcedServer ok =
      forced(vision_model_dir("mistral3"),
             "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_weather"
             "[ARGS]{\"city\": \"Lyon\"}");
  HttpResult r = post_json(ok.port(), "/v1/chat/completions",
                           chat(system_user("Paris and Lyon?"), weather_tools()));
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& m = r.body["choices"][0]["message"];
  ASSERT_EQ(m["tool_calls"].size(), 2u) << m;
  EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], R"({"city":"Lyon"})");
  EXPECT_NE(m["tool_calls"][0]["id"], m["tool_calls"][1]["id"]);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "tool_calls");
  // parallel_tool_calls: false keeps the first call.
  json one = chat(system_user("Paris and Lyon?"), weather_tools());
  one["parallel_tool_calls"] = false;
  r = post_json(ok.port(), "/v1/chat/completions", one);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(r.body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city":"Paris"})");

  // A malformed call is the answer's text, markers and all: never a 500.
  const std::string bad = "[TOOL_CALLS]get_weather{\"city\": \"Paris\"";
  ForcedServer broken = forced(vision_model_dir("mistral3"), bad);
  json body = chat(system_user("Paris?"), weather_tools());
  r = post_json(broken.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], bad);
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  body["stream"] = true;
  Streamed got = collect(post_stream(broken.port(), "/v1/chat/completions", body));
  EXPECT_EQ(got.content, bad);
  EXPECT_TRUE(got.calls.empty());
  EXPECT_EQ(got.finish, "stop");
  // The forced-output test hook bypasses constrained decoding, so
  // "required" does not change what the model wrote: it comes back as it is.
  body["stream"] = false;
  body["tool_choice"] = "required";
  r = post_json(broken.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], bad);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
}

TEST(ServerTools, ToolRequestWithAnImageGoesThroughTheVisionLane) {
  // The tiny model's context is 256 tokens: a short tool, a short call.
  const std::string dir = vision_model_dir("gemma4");
  ChildServer srv({dir, "--threads", "1"},
                  {"TANDEM_FORCE_OUTPUT=<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
                   "<tool_call|><|tool_response>"});
  ASSERT_TRUE(srv.ready()) << srv.log();
  const std::string url =
      "data:image/png;base64," + base64(file_bytes(vision_fixture_dir("gemma4") + "/input_0.png"));
  json messages = json::array(
      {{{"role", "user"},
        {"content", json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                 {{"type", "text"}, {"text", "What's the weather there?"}}})}}});
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  for (bool stream : {false, true}) {
    json body = chat(messages, tools);
    body["stream"] = stream;
    json call;
    std::string finish;
    if (stream) {
      Streamed got = collect(post_stream(srv.port(), "/v1/chat/completions", body));
      ASSERT_EQ(got.calls.size(), 1u);
      call = {{"name", got.calls[0]["name"]}, {"arguments", got.calls[0]["arguments"]}};
      finish = got.finish;
    } else {
      HttpResult r = post_json(srv.port(), "/v1/chat/completions", body);
      ASSERT_EQ(r.status, 200) << r.raw;
      ASSERT_EQ(r.body["choices"][0]["message"]["tool_calls"].size(), 1u) << r.raw;
      call = r.body["choices"][0]["message"]["tool_calls"][0]["function"];
      finish = r.body["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(call["name"], "get_weather");
    EXPECT_EQ(call["arguments"], R"({"city":"Paris"})");
    EXPECT_EQ(finish, "tool_calls");
  }
  EXPECT_EQ(http_get(srv.port(), "/v1/status").body["vision_lane_requests"], 2);
}

// The text stream keeps the marker tokens it is given and skips every other
// special token, as the plain stream does.
TEST(ServerTools, KeepingStreamKeepsOnlyTheMarkers) {
  auto gemma = server::ModelText::load(vision_model_dir("gemma4"));
  const std::vector<int32_t> keep =
      gemma->special_ids(text::tool_call_markers(text::ToolCallFormat::Gemma4));
  ASSERT_EQ(keep.size(), 4u);  // <|tool_call>, <tool_call|>, <|"|>, <|tool_response>
  const std::string out = "<|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|><turn|><|channel>after";
  const std::vector<int32_t> ids = gemma->tokenizer().encode(out, false);
  auto stream = gemma->start_keeping(keep);
  std::string got;
  for (int32_t id : ids) got += stream->push(id);
  got += stream->flush();
  EXPECT_EQ(got, "<|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|>after");
  // Mistral's tekken tokenizers: [TOOL_CALLS] is a control token.
  TempDir dir;
  std::filesystem::copy_file(source_dir() + "/tests/fixtures/tokenizer/tekken_tiny.json",
                             dir.path() + "/tekken.json");
  auto tekken = server::ModelText::load(dir.path());
  ASSERT_TRUE(tekken);
  EXPECT_EQ(tekken->special_ids({"[TOOL_CALLS]", "[ARGS]", "[INST]", "not a token"}),
            std::vector<int32_t>({9, 3}));
  auto t = tekken->start_keeping({9});
  std::string tt = t->push(9) + t->push(3);
  EXPECT_EQ(tt + t->flush(), "[TOOL_CALLS]");
}

// ---- Qwen3, with the real tokenizer (skipped when it is not cached) ----

std::string qwen3_model(TempDir& dir) {
  const char* home = std::getenv("HOME");
  const std::string tok = std::string(home ? home : "/root") + "/.cache/tandem/tokenizers/qwen3";
  if (!std::filesystem::exists(tok + "/tokenizer.json")) return "";
  std::ofstream(dir.path() + "/config.json")
      << R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 32,
      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
      "intermediate_size": 64, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
      "tie_word_embeddings": true, "eos_token_id": 151645, "rope_theta": 1000000.0})";
  const std::string model = dir.path() + "/model";
  auto r = run_tandem("synth " + dir.path() + "/config.json " + model + " --dtype bf16 --seed 5");
  if (r.exit_code != 0) return "";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(tok + "/" + f, model + "/" + f);
  return model;
}

TEST(ServerTools, Qwen3ThinkingAndCalls) {
  TempDir dir;
  const std::string model = qwen3_model(dir);
  if (model.empty()) GTEST_SKIP() << "the Qwen3 tokenizer is not cached";
  const std::string out =
      "<think>\nThe user asks about Paris. I'll call get_weather.\n</think>\n\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  ForcedServer s = forced(model, out);
  json body = chat(user("Weather in Paris?"), weather_tools());
  HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& m = r.body["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "The user asks about Paris. I'll call get_weather.");
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "tool_calls");
  body["stream"] = true;
  Streamed got = collect(post_stream(s.port(), "/v1/chat/completions", body));
  EXPECT_EQ(got.reasoning, m["reasoning_content"]);
  EXPECT_EQ(got.content, "");
  ASSERT_EQ(got.calls.size(), 1u);
  EXPECT_EQ(got.calls[0]["arguments"], R"({"city":"Paris"})");

  // The round trip renders as Qwen3's template writes calls and results.
  EXPECT_NE(rendered(*s.text, round_trip_messages(), weather_tools())
                .find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                      "<|im_start|>user\n<tool_response>\n20 C\n</tool_response><|im_end|>\n"),
            std::string::npos)
      << rendered(*s.text, round_trip_messages(), weather_tools());

  // The thinking switch: the template's default (on), off per request (an
  // empty <think></think> block in the prompt), off by --no-thinking unless
  // the request turns it on.
  auto prompt_tokens = [](int port, json b) {
    HttpResult x = post_json(port, "/v1/chat/completions", b);
    EXPECT_EQ(x.status, 200) << x.raw;
    return x.body["usage"]["prompt_tokens"].get<int>();
  };
  const json plain = chat(user("Hi"));
  json off = plain, off_kwargs = plain, on = plain;
  off["enable_thinking"] = false;
  off_kwargs["chat_template_kwargs"] = {{"enable_thinking", false}};
  on["enable_thinking"] = true;
  const int think = prompt_tokens(s.port(), plain);
  const int no_think = prompt_tokens(s.port(), off);
  EXPECT_GT(no_think, think);
  EXPECT_EQ(prompt_tokens(s.port(), off_kwargs), no_think);
  server::ServerOptions so;
  so.no_thinking = true;
  ForcedServer quiet = forced(model, "Hello.", so);
  EXPECT_EQ(prompt_tokens(quiet.port(), plain), no_think);
  EXPECT_EQ(prompt_tokens(quiet.port(), on), think);
  HttpResult hello = post_json(quiet.port(), "/v1/chat/completions", plain);
  EXPECT_EQ(hello.body["choices"][0]["message"]["content"], "Hello.");
  EXPECT_FALSE(hello.body["choices"][0]["message"].contains("reasoning_content"));
}

// ---- A scripted text stream: chunk boundaries where the test wants them ----

// Qwen3-like: the prompt ends inside a <think> block (its last token's text
// is "<think>\n"), and records what the template was given.
class ThinkingBuilder : public server::PromptBuilder {
 public:
  std::vector<int32_t> chat_prompt(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   const nlohmann::ordered_json& kwargs,
                                   const server::ChatImages* = nullptr) override {
    last_messages = messages.dump();
    last_tools = tools.dump();
    last_kwargs = kwargs;
    return {1, 2, 3};
  }
  std::vector<int32_t> text_prompt(const std::string&) override { return {1}; }
  std::string token_text(int32_t id) override { return id == 3 ? "<think>\n" : "x"; }
  text::ChatFormat chat_format() const override {
    return {text::ReasoningFormat::Think, text::ToolCallFormat::Hermes};
  }
  std::string last_messages, last_tools;
  json last_kwargs;
};

class ScriptedStreamer : public TextStreamer {
 public:
  explicit ScriptedStreamer(std::vector<std::string> chunks) : chunks_(std::move(chunks)) {}
  std::unique_ptr<TextStream> start() const override { return std::make_unique<Stream>(chunks_); }

 private:
  struct Stream : TextStream {
    explicit Stream(std::vector<std::string> c) : chunks(std::move(c)) {}
    std::string push(int32_t) override { return next < chunks.size() ? chunks[next++] : ""; }
    std::string flush() override { return ""; }
    std::vector<std::string> chunks;
    size_t next = 0;
  };
  std::vector<std::string> chunks_;
};

struct ScriptedServer {
  ThinkingBuilder builder;
  ScriptedStreamer streamer;
  std::unique_ptr<LiveServer> srv;
  explicit ScriptedServer(std::vector<std::string> chunks, server::ServerOptions so = {})
      : streamer(chunks) {
    LiveServerConfig c;
    c.builder = &builder;
    c.streamer = &streamer;
    c.options = so;
    c.engine.forced_output.assign(chunks.size(), 100);  // one token per chunk, then the end
    srv = std::make_unique<LiveServer>(c);
  }
  int port() const { return srv->port(); }
};

TEST(ServerTools, MarkersSplitAcrossStreamChunks) {
  ScriptedServer s(
      {"Need", " a tool.\n</th", "ink>\n\nLet me look.\n<tool", "_call>\n{\"name\": \"a\", \"argu",
       "ments\": {\"x\": 1}}\n</tool_call>\n<tool_call>", "\n{\"name\": \"b\"}\n</tool_call>"});
  json body = chat(user("go"), weather_tools());
  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  Streamed got = collect(st);
  EXPECT_EQ(got.reasoning, "Need a tool.");
  EXPECT_EQ(got.content, "Let me look.");
  ASSERT_EQ(got.calls.size(), 2u);
  EXPECT_EQ(got.calls[0]["name"], "a");
  EXPECT_EQ(got.calls[0]["arguments"], R"({"x":1})");
  EXPECT_EQ(got.calls[1]["name"], "b");
  EXPECT_EQ(got.calls[1]["arguments"], "{}");
  EXPECT_EQ(got.finish, "tool_calls");
  // Incremental: the first token's reasoning arrives in the first chunk, and
  // each call in the chunk of the token that closed it.
  EXPECT_EQ(st.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(st.events[0]["choices"][0]["delta"]["reasoning_content"], "Need");
  EXPECT_EQ(st.events[4]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "a");
  EXPECT_EQ(st.events[5]["choices"][0]["delta"]["tool_calls"][0]["index"], 1);
  // The non-stream answer is the same; parallel_tool_calls=false keeps one call.
  body["stream"] = false;
  body["parallel_tool_calls"] = false;
  HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["message"]["reasoning_content"], "Need a tool.");
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "Let me look.");
  EXPECT_EQ(r.body["choices"][0]["message"]["tool_calls"].size(), 1u);
}

TEST(ServerTools, StreamedArgumentsArriveInPieces) {
  ScriptedServer s({"Plan.", "</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"argu",
                    "ments\": {\"ci", "ty\": \"Pa", "ris\", \"n\": [1,\n 2]}}\n</tool", "_call>"});
  json body = chat(user("go"), weather_tools());
  body["stream"] = true;
  SseResult st = post_stream(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(st.status, 200) << st.raw;
  std::vector<json> pieces;
  for (const json& e : st.events)
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("tool_calls"))
      pieces.push_back(e["choices"][0]["delta"]["tool_calls"][0]);
  // The first piece names the call as soon as its arguments open; the
  // others carry only the index and more arguments.
  ASSERT_EQ(pieces.size(), 3u) << st.raw;
  EXPECT_EQ(pieces[0]["index"], 0);
  EXPECT_EQ(pieces[0]["type"], "function");
  EXPECT_EQ(pieces[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(pieces[0]["function"]["name"], "get_weather");
  EXPECT_EQ(pieces[0]["function"]["arguments"], "{\"ci");
  for (size_t i = 1; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i], json({{"index", 0},
                               {"function", {{"arguments", pieces[i]["function"]["arguments"]}}}}));
  }
  Streamed got = collect(st);
  EXPECT_EQ(got.reasoning, "Plan.");
  EXPECT_EQ(got.content, "");
  EXPECT_EQ(got.finish, "tool_calls");
  ASSERT_EQ(got.calls.size(), 1u);
  body["stream"] = false;
  HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& call = r.body["choices"][0]["message"]["tool_calls"][0]["function"];
  EXPECT_EQ(call["arguments"], R"({"city":"Paris","n":[1,2]})");
  EXPECT_EQ(got.calls[0]["arguments"], call["arguments"]);
}

TEST(ServerTools, TemplateInputsKeepTheClientsOrderAndTheThinkingSwitch) {
  server::ServerOptions so;
  so.no_thinking = true;
  ScriptedServer s({"ok"}, so);
  // Keys in the client's order (OpenAI's: type before function, name first).
  const std::string raw = R"({"messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"zeta": {"type": "string"}, "alpha": {"type": "number"}}}}}],
    "chat_template_kwargs": {"custom": 1}})";
  HttpResult r = http_post(s.port(), "/v1/chat/completions", raw);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(s.builder.last_tools,
            R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
            R"("properties":{"zeta":{"type":"string"},"alpha":{"type":"number"}}}}}])");
  EXPECT_EQ(s.builder.last_kwargs, json({{"custom", 1}, {"enable_thinking", false}}));
  json body = json::parse(raw);
  body["enable_thinking"] = true;
  ASSERT_EQ(post_json(s.port(), "/v1/chat/completions", body).status, 200);
  EXPECT_EQ(s.builder.last_kwargs, json({{"custom", 1}, {"enable_thinking", true}}));
  body["chat_template_kwargs"]["enable_thinking"] = false;  // the kwargs win
  ASSERT_EQ(post_json(s.port(), "/v1/chat/completions", body).status, 200);
  EXPECT_EQ(s.builder.last_kwargs, json({{"custom", 1}, {"enable_thinking", false}}));
  // Without tools in the request, none reach the template.
  ASSERT_EQ(post_json(s.port(), "/v1/chat/completions", chat(user("hi"))).status, 200);
  EXPECT_EQ(s.builder.last_tools, "null");
}

TEST(ServerTools, BadToolFieldsAre400s) {
  ScriptedServer s({"ok"});
  struct Case {
    std::function<void(json&)> edit;
    const char* code;
    const char* param;
  };
  const std::vector<Case> cases = {
      {[](json& b) { b["tool_choice"] = "always"; }, "invalid_value", "tool_choice"},
      {[](json& b) { b["tool_choice"] = 3; }, "invalid_type", "tool_choice"},
      {[](json& b) {
         b["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
       },
       "invalid_value", "tool_choice.function.name"},
      {[](json& b) {
         b["tool_choice"] = {{"type", "function"}};
       },
       "missing_required_parameter", "tool_choice.function"},
      {[](json& b) {
         b.erase("tools");
         b["tool_choice"] = "required";
       },
       "invalid_value", "tool_choice"},
      {[](json& b) { b["parallel_tool_calls"] = "yes"; }, "invalid_type", "parallel_tool_calls"},
      {[](json& b) { b["enable_thinking"] = 1; }, "invalid_type", "enable_thinking"},
  };
  for (const Case& c : cases) {
    json body = chat(user("hi"), weather_tools());
    c.edit(body);
    HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
    SCOPED_TRACE(body.dump());
    EXPECT_EQ(r.status, 400) << r.raw;
    EXPECT_EQ(r.body["error"]["code"], c.code) << r.raw;
    EXPECT_EQ(r.body["error"]["param"], c.param) << r.raw;
  }
  // A named function that exists is valid; enforcing it needs the
  // vocabulary, which this scripted builder lacks (tests/test_tool_choice.cpp
  // runs real ones).
  json named = chat(user("hi"), weather_tools());
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  HttpResult r = post_json(s.port(), "/v1/chat/completions", named);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "tool_choice") << r.raw;
}

}  // namespace
