// tool_choice "required" and named functions, enforced by constrained
// decoding (server/tool_choice.h, text/tool_call_grammar.h): random-weight
// models at temperature 1.0 always answer with calls that parse, name an
// allowed function and whose arguments validate — for every family's call
// syntax, on the text and vision lanes, through chat completions, the
// Anthropic Messages API and the Responses API. Also the reasoning budget
// (thinking_budget / Anthropic's thinking.budget_tokens), the other use of
// the token constraint for agents.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "server/model_text.h"
#include "test_server_util.h"
#include "test_util.h"
#include "text/json_schema_grammar.h"
#include "text/tool_call_grammar.h"

using namespace tandem;
using namespace tandem::test;
using ojson = nlohmann::ordered_json;

namespace {

// Short declarations: the tiny models' context is 256 tokens.
json small_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                     "exact": {"type": "boolean"}, "tags": {"type": "array",
                     "items": {"enum": ["x", "y"]}, "maxItems": 2}},
      "required": ["a", "b"]}}}])");
}

// A validator for the keywords small_tools() uses.
bool valid(const json& v, const json& s) {
  if (s.contains("enum")) {
    for (const json& e : s["enum"])
      if (v == e) return true;
    return false;
  }
  const std::string t = s.value("type", "");
  if (t == "string") {
    if (!v.is_string()) return false;
    const std::string& str = v.get_ref<const std::string&>();
    const auto n = std::count_if(str.begin(), str.end(), [](char c) { return (c & 0xC0) != 0x80; });
    return !s.contains("maxLength") || n <= s["maxLength"].get<int>();
  }
  if (t == "integer") return v.is_number_integer();
  if (t == "boolean") return v.is_boolean();
  if (t == "array") {
    if (!v.is_array() || v.size() > s.value("maxItems", size_t(1000))) return false;
    for (const json& x : v)
      if (!valid(x, s["items"])) return false;
    return true;
  }
  if (t == "object") {
    if (!v.is_object()) return false;
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (auto it = v.begin(); it != v.end(); ++it)
      if (!s["properties"].contains(it.key()) || !valid(it.value(), s["properties"][it.key()]))
        return false;
    return true;
  }
  return false;
}

// Checks one call against the tools (and the named function, if any).
void expect_valid_call(const json& tools, const std::string& name, const std::string& arguments,
                       const std::string& only, const std::string& where) {
  SCOPED_TRACE(where + " " + name + " " + arguments);
  if (!only.empty()) {
    EXPECT_EQ(name, only);
  }
  const json* schema = nullptr;
  for (const json& t : tools)
    if (t["function"]["name"] == name) schema = &t["function"]["parameters"];
  ASSERT_NE(schema, nullptr) << "unknown function";
  json args;
  ASSERT_NO_THROW(args = json::parse(arguments));
  EXPECT_TRUE(valid(args, *schema)) << arguments;
}

// A model folder: random weights of `config` with a cached real tokenizer
// (and a template from the fixtures); "" when the tokenizer is not cached.
std::string synth_model(TempDir& dir, const std::string& tokenizer, const std::string& config,
                        const std::string& template_fixture = "") {
  const char* home = std::getenv("HOME");
  const std::string tok =
      std::string(home ? home : "/root") + "/.cache/tandem/tokenizers/" + tokenizer;
  if (!std::filesystem::exists(tok + "/tokenizer.json")) return "";
  std::ofstream(dir.path() + "/config.json") << config;
  const std::string model = dir.path() + "/model";
  if (run_tandem("synth " + dir.path() + "/config.json " + model + " --dtype bf16 --seed 5")
          .exit_code != 0)
    return "";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(tok + "/" + f, model + "/" + f);
  if (!template_fixture.empty())
    std::filesystem::copy_file(source_dir() + "/tests/fixtures/templates/" + template_fixture,
                               model + "/chat_template.jinja");
  return model;
}

std::string qwen3_model(TempDir& dir) {
  return synth_model(dir, "qwen3", R"({"model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "intermediate_size": 64, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "eos_token_id": 151645,
    "rope_theta": 1000000.0})");
}

std::string llama_model(TempDir& dir) {
  return synth_model(dir, "llama3_1", R"({"model_type": "llama", "vocab_size": 128256,
    "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
    "intermediate_size": 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": true, "eos_token_id": [128001, 128008, 128009],
    "rope_theta": 500000.0})",
                     "llama3_2/chat_template.jinja");
}

// vision_model_dir(family) with a 4096-token context (the fixtures' 256 do
// not hold the tools' declarations): random weights either way.
std::string long_context_dir(const std::string& family) {
  static std::map<std::string, std::unique_ptr<TempDir>> dirs;
  auto& dir = dirs[family];
  if (dir) return dir->path();
  dir = std::make_unique<TempDir>();
  const std::string src = vision_model_dir(family);
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "config.json")
      std::filesystem::create_symlink(std::filesystem::canonical(e.path()),
                                      dir->path() + "/" + e.path().filename().string());
  json config = json::parse(file_bytes(src + "/config.json"));
  auto widen = [](json& j, auto&& self) -> void {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "max_position_embeddings") *it = 4096;
      if (it->is_object()) self(*it, self);
    }
  };
  widen(config, widen);
  std::ofstream(dir->path() + "/config.json") << config.dump();
  return dir->path();
}

struct ModelServer {
  std::unique_ptr<server::ModelText> text;
  std::unique_ptr<LiveServer> srv;
  explicit ModelServer(const std::string& dir) {
    text = server::ModelText::load(dir);
    LiveServerConfig c;
    c.model_dir = dir;
    c.builder = text.get();
    c.streamer = text.get();
    c.engine.threads = 2;
    srv = std::make_unique<LiveServer>(c);
  }
  int port() const { return srv->port(); }
};

json messages_for(const std::string& family) {
  json m = json::array();
  if (family == "mistral3") m.push_back({{"role", "system"}, {"content", "Be brief."}});
  m.push_back({{"role", "user"}, {"content", "Go."}});
  return m;
}

// The calls of a stream, merged by index as the SDKs merge them.
json stream_calls(const SseResult& s, std::string& content) {
  json calls = json::array();
  for (const json& e : s.events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"];
    if (!d.contains("tool_calls")) continue;
    for (const json& t : d["tool_calls"]) {
      const size_t i = t["index"];
      while (calls.size() <= i) calls.push_back({{"name", ""}, {"arguments", ""}});
      if (t["function"].contains("name")) calls[i]["name"] = t["function"]["name"];
      calls[i]["arguments"] =
          calls[i]["arguments"].get<std::string>() + t["function"].value("arguments", "");
    }
  }
  return calls;
}

struct Tally {
  int calls = 0, multi = 0, cut = 0;
} tally;

// Required and named, one call and parallel calls, `seeds` seeds each, at
// temperature 1.0: every answer is calls, all valid. Returns the count.
int run_family(const std::string& family, int port, int seeds, const json& image = nullptr) {
  const json tools = small_tools();
  int checked = 0;
  for (int seed = 1; seed <= seeds; ++seed)
    for (const std::string& only : {std::string(), std::string("add"), std::string("weather")})
      for (bool parallel : {false, true}) {
        json body = {{"messages", messages_for(family)},
                     {"tools", tools},
                     {"temperature", 1.0},
                     {"seed", seed},
                     {"parallel_tool_calls", parallel}};
        if (!image.is_null())
          body["messages"].back()["content"] =
              json::array({image, {{"type", "text"}, {"text", "Go."}}});
        body["tool_choice"] = only.empty()
                                  ? json("required")
                                  : json({{"type", "function"}, {"function", {{"name", only}}}});
        const bool stream = seed % 2 == 0;
        body["stream"] = stream;
        const std::string where = family + " seed " + std::to_string(seed) + " " +
                                  (only.empty() ? "required" : only) +
                                  (parallel ? " parallel" : " single") + (stream ? " stream" : "");
        json calls = json::array();
        std::string content, finish;
        if (stream) {
          SseResult st = post_stream(port, "/v1/chat/completions", body);
          EXPECT_EQ(st.status, 200) << where << st.raw;
          calls = stream_calls(st, content);
          finish = st.finish_reason();
        } else {
          HttpResult r = post_json(port, "/v1/chat/completions", body);
          EXPECT_EQ(r.status, 200) << where << r.raw;
          if (r.status != 200) continue;
          const json& m = r.body["choices"][0]["message"];
          finish = r.body["choices"][0]["finish_reason"];
          if (m["content"].is_string()) content = m["content"];
          for (const json& c : m.value("tool_calls", json::array())) calls.push_back(c["function"]);
        }
        // Calls always; content only from a call cut off at the end of the
        // context (finish "length").
        EXPECT_GE(calls.size(), 1u) << where << " content: " << content;
        if (finish != "length") {
          EXPECT_EQ(finish, "tool_calls") << where;
          EXPECT_EQ(content, "") << where;
        }
        if (!parallel) {
          EXPECT_EQ(calls.size(), 1u) << where;
        }
        for (const json& c : calls)
          expect_valid_call(tools, c["name"], c["arguments"], only, where);
        tally.calls += int(calls.size());
        tally.multi += calls.size() > 1;
        tally.cut += finish == "length";
        ++checked;
      }
  return checked;
}

}  // namespace

TEST(ToolChoiceGrammar, SentencesParseIntoTheirCalls) {
  // The grammar with markers as text: a hand-written sentence per family is
  // accepted, and what the parser makes of it is the call.
  const json tools = small_tools();
  for (text::ToolCallFormat f : {text::ToolCallFormat::Hermes, text::ToolCallFormat::Llama3Json,
                                 text::ToolCallFormat::Mistral, text::ToolCallFormat::Gemma4}) {
    text::ToolGrammarSpec spec;
    spec.format = f;
    spec.marker = [](std::string_view m) { return std::string(m); };
    for (size_t i = 0; i < tools.size(); ++i)
      spec.tools.push_back({tools[i]["function"]["name"],
                            ojson::parse(tools[i]["function"]["parameters"].dump()), i});
    auto g = std::make_shared<const text::Grammar>(text::tool_call_grammar(spec));
    std::string call;
    switch (f) {
      case text::ToolCallFormat::Hermes:
        call =
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1, \"b\":-2}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Oslo\"}}\n"
            "</tool_call>";
        break;
      case text::ToolCallFormat::Llama3Json:
        call =
            "{\"name\": \"add\", \"parameters\": {\"a\":1,\"b\":-2}}; {\"name\": \"weather\", "
            "\"parameters\": {\"city\":\"Oslo\"}}";
        break;
      case text::ToolCallFormat::Mistral:
        call =
            "[TOOL_CALLS]add[ARGS]{\"a\":1,\"b\":-2}[TOOL_CALLS]weather[ARGS]{\"city\":\"Oslo\"}";
        break;
      default:
        call =
            "<|tool_call>call:add{a:1,b:-2}<tool_call|><|tool_call>call:weather{city:<|\"|>Oslo"
            "<|\"|>}<tool_call|>";
    }
    SCOPED_TRACE(call);
    text::GrammarMatcher m(g);
    ASSERT_TRUE(m.accept(call));
    EXPECT_TRUE(m.accepting());
    text::ToolCallParser p(f);
    text::ToolCallDelta d = p.push(call);
    text::ToolCallDelta e = p.flush();
    d.calls.insert(d.calls.end(), e.calls.begin(), e.calls.end());
    EXPECT_EQ(d.content + e.content, "");
    ASSERT_EQ(d.calls.size(), 2u);
    EXPECT_EQ(d.calls[0], (text::ToolCall{"add", R"({"a":1,"b":-2})"}));
    EXPECT_EQ(d.calls[1], (text::ToolCall{"weather", R"({"city":"Oslo"})"}));
    // Not a missing required argument, an unknown function or a second call
    // when one is asked for.
    text::GrammarMatcher bad(g);
    EXPECT_FALSE(bad.accept(f == text::ToolCallFormat::Gemma4 ? "<|tool_call>call:add{a:1}<"
                            : f == text::ToolCallFormat::Mistral
                                ? "[TOOL_CALLS]add[ARGS]{\"a\":1}"
                                : "{\"name\": \"add\", \"parameters\": {\"a\":1}}") &&
                 bad.accepting());
  }
}

TEST(ToolChoiceServer, RandomModelsAlwaysCallOnEveryFamily) {
  int total = 0;
  TempDir q, l;
  const std::vector<std::pair<std::string, std::string>> models = {
      {"gemma4", long_context_dir("gemma4")},
      {"mistral3", long_context_dir("mistral3")},
      {"qwen3", qwen3_model(q)},
      {"llama", llama_model(l)}};
  for (const auto& [family, dir] : models) {
    if (dir.empty()) continue;  // the real tokenizer is not cached
    ModelServer s(dir);
    total += run_family(family, s.port(), 6);
  }
  std::cout << "[ tool_choice ] " << total << " requests, " << tally.calls << " calls ("
            << tally.multi << " answers with several), " << tally.cut
            << " cut by the context; all valid\n";
  EXPECT_GE(total, 2 * 6 * 6);
}

TEST(ToolChoiceServer, VisionLaneRequestsAlsoCall) {
  for (const char* family : {"gemma4", "mistral3"}) {
    const std::string url =
        "data:image/png;base64," + base64(file_bytes(vision_fixture_dir(family) + "/input_0.png"));
    const json image = {{"type", "image_url"}, {"image_url", {{"url", url}}}};
    ChildServer srv({long_context_dir(family), "--threads", "2"});
    ASSERT_TRUE(srv.ready()) << srv.log();
    EXPECT_EQ(run_family(family, srv.port(), 2, image), 12) << family;
    EXPECT_EQ(http_get(srv.port(), "/v1/status").body["vision_lane_requests"], 12);
  }
}

TEST(ToolChoiceServer, UnknownCallSyntaxAndBadCombinationsAre400) {
  // Gemma 3's template has no tool-call syntax.
  ModelServer s(vision_model_dir("gemma3"));
  json body = {
      {"messages", messages_for("gemma3")}, {"tools", small_tools()}, {"tool_choice", "required"}};
  HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "tool_choice");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("tool-call syntax"),
            std::string::npos)
      << r.raw;
  body["tool_choice"] = "auto";  // auto still works (nothing to parse)
  body["max_tokens"] = 4;
  EXPECT_EQ(post_json(s.port(), "/v1/chat/completions", body).status, 200);

  ModelServer g(long_context_dir("gemma4"));
  body["tool_choice"] = "required";
  body["response_format"] = {{"type", "json_object"}};
  r = post_json(g.port(), "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "response_format");
  body.erase("response_format");
  body["tools"][0]["function"]["parameters"]["properties"]["city"]["minLength"] = -1;
  r = post_json(g.port(), "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(r.body["error"]["param"], "tools[0].function.parameters.properties.city.minLength");
}

TEST(ToolChoiceServer, AnthropicAndResponsesChoicesAreEnforced) {
  ModelServer s(long_context_dir("gemma4"));
  const json tools = small_tools();
  json anthropic_tools = json::array(), responses_tools = json::array();
  for (const json& t : tools) {
    anthropic_tools.push_back(
        {{"name", t["function"]["name"]}, {"input_schema", t["function"]["parameters"]}});
    responses_tools.push_back({{"type", "function"},
                               {"name", t["function"]["name"]},
                               {"parameters", t["function"]["parameters"]}});
  }
  for (int i = 0; i < 4; ++i) {
    const json choice = i % 2 ? json({{"type", "tool"}, {"name", "add"}}) : json({{"type", "any"}});
    HttpResult r = post_json(s.port(), "/v1/messages",
                             {{"max_tokens", 150},
                              {"temperature", 1.0},
                              {"messages", {{{"role", "user"}, {"content", "Go."}}}},
                              {"tools", anthropic_tools},
                              {"tool_choice", choice}});
    ASSERT_EQ(r.status, 200) << r.raw;
    int uses = 0;
    for (const json& b : r.body["content"])
      if (b["type"] == "tool_use") {
        ++uses;
        expect_valid_call(tools, b["name"], b["input"].dump(), i % 2 ? "add" : "", "anthropic");
      }
    EXPECT_GE(uses, 1) << r.raw;
    if (r.body["stop_reason"] != "max_tokens") {
      EXPECT_EQ(r.body["stop_reason"], "tool_use");
    }

    const json rchoice =
        i % 2 ? json({{"type", "function"}, {"name", "weather"}}) : json("required");
    r = post_json(s.port(), "/v1/responses",
                  {{"input", "Go."},
                   {"max_output_tokens", 150},
                   {"temperature", 1.0},
                   {"tools", responses_tools},
                   {"tool_choice", rchoice}});
    ASSERT_EQ(r.status, 200) << r.raw;
    int fcalls = 0;
    for (const json& item : r.body["output"])
      if (item["type"] == "function_call") {
        ++fcalls;
        expect_valid_call(tools, item["name"], item["arguments"], i % 2 ? "weather" : "",
                          "responses");
      }
    EXPECT_GE(fcalls, 1) << r.raw;
  }
}

TEST(ReasoningBudget, TheClosingMarkerIsForcedAfterTheBudget) {
  TempDir dir;
  const std::string model = qwen3_model(dir);
  if (model.empty()) GTEST_SKIP() << "the Qwen3 tokenizer is not cached";
  // A template whose generation prompt opens the reasoning block, so that a
  // random model is inside it from its first token.
  std::ofstream(model + "/chat_template.jinja")
      << "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
         "{% endfor %}<|im_start|>assistant\n<think>\n";
  ModelServer s(model);
  const int32_t close = s.text->tokenizer().token_to_id("</think>");
  ASSERT_GE(close, 0);
  for (int budget : {1, 5, 12})
    for (int seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE("budget " + std::to_string(budget) + " seed " + std::to_string(seed));
      json body = {{"messages", {{{"role", "user"}, {"content", "Think."}}}},
                   {"temperature", 1.0},
                   {"seed", seed},
                   {"max_tokens", budget + 6},
                   {"thinking_budget", budget}};
      HttpResult r = post_json(s.port(), "/v1/chat/completions", body);
      ASSERT_EQ(r.status, 200) << r.raw;
      const std::vector<int32_t> ids = r.body["choices"][0]["token_ids"];
      const auto at = std::find(ids.begin(), ids.end(), close);
      ASSERT_NE(at, ids.end()) << r.raw;
      EXPECT_LE(at - ids.begin(), budget);  // at most `budget` reasoning tokens
      EXPECT_TRUE(r.body["choices"][0]["message"].contains("reasoning_content") ||
                  at == ids.begin());
    }
  // Anthropic's thinking.budget_tokens: the thinking block ends, an answer follows.
  HttpResult a = post_json(s.port(), "/v1/messages",
                           {{"max_tokens", 20},
                            {"temperature", 1.0},
                            {"thinking", {{"type", "enabled"}, {"budget_tokens", 4}}},
                            {"messages", {{{"role", "user"}, {"content", "Think."}}}}});
  ASSERT_EQ(a.status, 200) << a.raw;
  bool text_block = false;
  for (const json& b : a.body["content"]) text_block = text_block || b["type"] == "text";
  EXPECT_TRUE(text_block) << a.raw;
  HttpResult bad =
      post_json(s.port(), "/v1/chat/completions",
                {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"thinking_budget", 0}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.body["error"]["param"], "thinking_budget");
}
