// Tool-call parsing (text/tool_call_parser.h) on outputs written the way each
// family's chat template renders calls (Qwen3's <tool_call> JSON, Llama 3.1's
// JSON, Mistral's [TOOL_CALLS]name[ARGS]{...}, Gemma 4's call tokens):
// complete, split at every byte, one byte at a time, and malformed (which
// must come back as content, never an error).
#include <gtest/gtest.h>

#include <random>
#include <tuple>

#include "text/chat_output.h"
#include "text/tool_call_parser.h"

using namespace tandem::text;
using nlohmann::json;

namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
  bool operator==(const Parsed&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Parsed& p) {
  json calls = json::array();
  for (const ToolCall& c : p.calls) calls.push_back({c.name, c.arguments});
  return os << "{content: " << json(p.content).dump() << ", calls: " << calls.dump() << "}";
}

Parsed run(ToolCallFormat f, const std::vector<std::string_view>& chunks) {
  ToolCallParser p(f);
  Parsed out;
  auto add = [&](ToolCallDelta d) {
    out.content += d.content;
    for (ToolCall& c : d.calls) out.calls.push_back(c);
  };
  for (std::string_view c : chunks) add(p.push(c));
  add(p.flush());
  EXPECT_EQ(p.calls(), int(out.calls.size()));
  return out;
}

void expect_parse(ToolCallFormat f, const std::string& text, const Parsed& want) {
  SCOPED_TRACE(json(text).dump());
  EXPECT_EQ(run(f, {text}), want);
  const std::string_view t = text;
  for (size_t i = 0; i <= text.size(); ++i)
    ASSERT_EQ(run(f, {t.substr(0, i), t.substr(i)}), want) << "split at byte " << i;
  for (size_t a = 0; a < text.size(); a += 7)  // three chunks, many places
    for (size_t b = a; b <= text.size(); b += 5)
      ASSERT_EQ(run(f, {t.substr(0, a), t.substr(a, b - a), t.substr(b)}), want)
          << "split at " << a << " and " << b;
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(t.substr(i, 1));
  EXPECT_EQ(run(f, bytes), want) << "byte by byte";
}

// Malformed: the whole text is content, unchanged.
void expect_content(ToolCallFormat f, const std::string& text) {
  expect_parse(f, text, {text, {}});
}

ToolCall call(const std::string& name, const std::string& args) {
  return {name, args};
}

// ---- Qwen3 (Hermes) ----

TEST(ToolCallParser, Qwen3Calls) {
  using enum ToolCallFormat;
  // As Qwen3's template renders an assistant turn with tool calls.
  expect_parse(Hermes,
               "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"unit\": \"celsius\"}}\n</tool_call>",
               {"", {call("get_weather", R"({"city":"Paris","unit":"celsius"})")}});
  // Text first, two calls, the model's key order kept.
  expect_parse(
      Hermes,
      "I'll look both up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"unit\": \"celsius\", \"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>",
      {"I'll look both up.",
       {call("get_weather", R"({"unit":"celsius","city":"Paris"})"),
        call("get_time", R"({"tz":"Europe/Paris"})")}});
  // Arguments as a JSON string, nested values, braces and tags inside strings.
  expect_parse(
      Hermes,
      "<tool_call>\n{\"name\": \"write_file\", \"arguments\": \"{\\\"path\\\": \\\"a.c\\\", "
      "\\\"text\\\": \\\"int main() { return 0; } </tool\\\"}\"}\n</tool_call>",
      {"", {call("write_file", R"({"path":"a.c","text":"int main() { return 0; } </tool"})")}});
  expect_parse(Hermes, "<tool_call>\n{\"name\": \"now\"}\n</tool_call>", {"", {call("now", "{}")}});
  // Unicode passes through.
  expect_parse(Hermes,
               "<tool_call>{\"name\": \"translate\", \"arguments\": {\"text\": \"café — "
               "東京\"}}</tool_call>",
               {"", {call("translate", R"({"text":"café — 東京"})")}});
  // Text after the calls is content.
  expect_parse(
      Hermes,
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nThen I will answer.",
      {"Then I will answer.", {call("a", "{}")}});
  // Plain answers keep every byte, whitespace included.
  expect_content(Hermes, "  Just text, with a < and a <tool and trailing space.  \n");
}

TEST(ToolCallParser, Qwen3MalformedCallsAreContent) {
  using enum ToolCallFormat;
  expect_content(
      Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>");
  expect_content(Hermes, "<tool_call>\n{\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  expect_content(Hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": [1, 2]}\n</tool_call>");
  expect_content(Hermes,
                 "<tool_call>\n{\"name\": \"f\", \"arguments\": \"not json\"}\n</tool_call>");
  expect_content(Hermes,
                 "<tool_call>\n{\"name\": \"get weather\", \"arguments\": {}}\n</tool_call>");
  // Cut off before the end (max_tokens).
  expect_content(Hermes,
                 "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci");
  // A bad call among good ones: only it is content.
  expect_parse(
      Hermes,
      "<tool_call>{oops}</tool_call><tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>",
      {"<tool_call>{oops}</tool_call>", {call("a", "{}")}});
}

// ---- Llama 3.1 / 3.2 JSON ----

TEST(ToolCallParser, Llama3JsonCalls) {
  using enum ToolCallFormat;
  expect_parse(Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
               {"", {call("get_weather", R"({"city":"Paris"})")}});
  // Several, separated by ";" (Llama 3.2), and the python_tag form (3.1).
  expect_parse(
      Llama3Json,
      "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
      {"", {call("a", R"({"x":1})"), call("b", "{}")}});
  expect_parse(Llama3Json,
               "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
               {"", {call("get_weather", R"({"city":"Paris"})")}});
  expect_parse(Llama3Json,
               "\n\n{\"type\": \"function\", \"name\": \"f\", \"arguments\": {\"q\": \"}\"}}",
               {"", {call("f", R"({"q":"}"})")}});
}

TEST(ToolCallParser, Llama3JsonMalformedAndPlainAnswers) {
  using enum ToolCallFormat;
  // A JSON answer that is not a call, text with braces, a truncated call,
  // and a python_tag with code instead of JSON: all content.
  expect_content(Llama3Json, "{\"answer\": 42}");
  expect_content(Llama3Json, "{\"answer\": 42} is the JSON you asked for.");
  expect_content(Llama3Json, "The set {1, 2} has two elements.");
  expect_content(Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par");
  expect_content(Llama3Json, "<|python_tag|>brave_search.call(query=\"weather\")");
  // A call, then prose: the prose is content.
  expect_parse(Llama3Json, "{\"name\": \"a\", \"parameters\": {}} Done.",
               {"Done.", {call("a", "{}")}});
}

// ---- Mistral ----

TEST(ToolCallParser, MistralCalls) {
  using enum ToolCallFormat;
  // As the Ministral 3 template renders calls: one [TOOL_CALLS] per call.
  expect_parse(Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
               {"", {call("get_weather", R"({"city":"Paris"})")}});
  expect_parse(
      Mistral,
      "Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time"
      "[ARGS]{}",
      {"Let me check.", {call("get_weather", R"({"city":"Paris"})"), call("get_time", "{}")}});
  expect_parse(Mistral, "[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Paris\"}",
               {"", {call("get_weather", R"({"city":"Paris"})")}});
  // The older JSON-array form.
  expect_parse(Mistral,
               "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
               "{\"name\": \"get_time\", \"arguments\": {}}]",
               {"", {call("get_weather", R"({"city":"Paris"})"), call("get_time", "{}")}});
}

TEST(ToolCallParser, MistralMalformedCallsAreContent) {
  using enum ToolCallFormat;
  expect_content(Mistral, "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}");
  expect_content(Mistral, "[TOOL_CALLS]get_weather[ARGS]\"Paris\"");
  expect_content(Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par");
  expect_content(Mistral, "[TOOL_CALLS][{\"arguments\": {}}]");
  expect_parse(Mistral, "[TOOL_CALLS]bad name[ARGS]{}[TOOL_CALLS]ok[ARGS]{}",
               {"[TOOL_CALLS]bad name[ARGS]{}", {call("ok", "{}")}});
  expect_parse(Mistral, "[TOOL_CALLS]broken[TOOL_CALLS]ok[ARGS]{}",
               {"[TOOL_CALLS]broken", {call("ok", "{}")}});
}

// ---- Gemma 4 ----

TEST(ToolCallParser, Gemma4Calls) {
  using enum ToolCallFormat;
  // As Gemma 4's template renders calls: format_argument with bare keys.
  expect_parse(
      Gemma4,
      "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>",
      {"", {call("get_weather", R"({"city":"Paris","unit":"celsius"})")}});
  expect_parse(
      Gemma4,
      "<|tool_call>call:search{filters:{lang:<|\"|>en<|\"|>,safe:true},limit:10,tags:[<|\"|>a<|\"|>"
      ","
      "<|\"|>b<|\"|>],ratio:0.5,cursor:None}<tool_call|>",
      {"",
       {call(
           "search",
           R"({"filters":{"lang":"en","safe":true},"limit":10,"tags":["a","b"],"ratio":0.5,"cursor":null})")}});
  // Brackets, commas and quotes inside strings are text.
  expect_parse(
      Gemma4,
      "<|tool_call>call:tools.shell-exec{cmd:<|\"|>grep -r \"a, {b}\" [src]<|\"|>}<tool_call|>",
      {"", {call("tools.shell-exec", R"({"cmd":"grep -r \"a, {b}\" [src]"})")}});
  // Two calls, text before, no arguments.
  expect_parse(
      Gemma4,
      "Checking both.<|tool_call>call:a{}<tool_call|><|tool_call>call:b{x:-3e2}<tool_call|>",
      {"Checking both.", {call("a", "{}"), call("b", R"({"x":-300.0})")}});
}

TEST(ToolCallParser, Gemma4MalformedCallsAreContent) {
  using enum ToolCallFormat;
  expect_content(Gemma4, "<|tool_call>get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>");
  expect_content(Gemma4, "<|tool_call>call:get_weather{city:Paris}<tool_call|>");  // bare word
  expect_content(Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris}<tool_call|>");
  expect_content(Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>");
  expect_content(Gemma4, "<|tool_call>call:f{a:1}}<tool_call|>");
  EXPECT_FALSE(parse_gemma4_value("{a:1,}"));
  EXPECT_EQ(*parse_gemma4_value("{\"k\":[1,true,<|\"|>x<|\"|>]}"),
            json::parse(R"({"k":[1,true,"x"]})"));
}

// ---- Reasoning, then calls ----

TEST(ChatOutputParser, ReasoningThenCalls) {
  auto all = [](ChatOutputParser p, const std::string& text, size_t step) {
    ChatDelta out;
    for (size_t i = 0; i < text.size(); i += step)
      out.append(p.push(std::string_view(text).substr(i, step)));
    out.append(p.flush());
    return out;
  };
  const std::string qwen =
      "<think>\nParis weather: call the tool.\n</think>\n\n<tool_call>\n{\"name\": "
      "\"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  for (size_t step : {size_t(1), size_t(3), qwen.size()}) {
    ChatDelta d =
        all(ChatOutputParser(ReasoningFormat::Think, false, ToolCallFormat::Hermes), qwen, step);
    EXPECT_EQ(d.reasoning, "Paris weather: call the tool.");
    EXPECT_EQ(d.content, "");
    ASSERT_EQ(d.calls.size(), 1u);
    EXPECT_EQ(d.calls[0], call("get_weather", R"({"city":"Paris"})"));
  }
  // A call written inside the reasoning is reasoning, not a call.
  ChatDelta d = all(ChatOutputParser(ReasoningFormat::Think, true, ToolCallFormat::Hermes),
                    "maybe <tool_call>{\"name\": \"a\"}</tool_call>?</think>No.", 2);
  EXPECT_EQ(d.reasoning, "maybe <tool_call>{\"name\": \"a\"}</tool_call>?");
  EXPECT_EQ(d.content, "No.");
  EXPECT_TRUE(d.calls.empty());
  const std::string gemma =
      "<|channel>thought\nNeed the "
      "weather.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}"
      "<tool_call|>";
  d = all(ChatOutputParser(ReasoningFormat::GemmaChannel, false, ToolCallFormat::Gemma4), gemma, 2);
  EXPECT_EQ(d.reasoning, "Need the weather.");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0], call("get_weather", R"({"city":"Paris"})"));
}

}  // namespace

namespace {

// Random outputs made of every format's pieces: whatever the model writes,
// parsing never fails, any chunking gives the same result, and an output
// with no call is all content, byte for byte.
TEST(ToolCallParser, RandomOutputsAreChunkingIndependentAndLoseNothing) {
  const std::vector<std::string> pieces = {"<tool_call>",
                                           "</tool_call>",
                                           "{",
                                           "}",
                                           "\"name\"",
                                           ": ",
                                           "\"f\"",
                                           ", ",
                                           "\"arguments\"",
                                           " ",
                                           "\n",
                                           "x",
                                           "[TOOL_CALLS]",
                                           "[ARGS]",
                                           "[CALL_ID]",
                                           "<|tool_call>",
                                           "<tool_call|>",
                                           "call:",
                                           "f",
                                           "<|\"|>",
                                           "[",
                                           "]",
                                           ";",
                                           "<|python_tag|>",
                                           "\"",
                                           "\\",
                                           "a:1",
                                           "<",
                                           "|>"};
  std::mt19937 rng(7);
  for (ToolCallFormat f : {ToolCallFormat::Hermes, ToolCallFormat::Llama3Json,
                           ToolCallFormat::Mistral, ToolCallFormat::Gemma4}) {
    for (int n = 0; n < 400; ++n) {
      std::string text;
      const int len = 1 + int(rng() % 24);
      for (int i = 0; i < len; ++i) text += pieces[rng() % pieces.size()];
      const Parsed whole = run(f, {text});
      if (whole.calls.empty()) {
        ASSERT_EQ(whole.content, text) << json(text).dump();
      }
      std::vector<std::string_view> chunks;
      for (size_t at = 0; at < text.size();) {
        const size_t step = 1 + rng() % 6;
        chunks.push_back(std::string_view(text).substr(at, step));
        at += step;
      }
      ASSERT_EQ(run(f, chunks), whole) << tool_call_format_name(f) << " " << json(text).dump();
    }
  }
  // Random pieces do make calls now and then.
  EXPECT_EQ(run(ToolCallFormat::Gemma4, {"<|tool_call>call:f{a:1}<tool_call|>"}).calls.size(), 1u);
}

TEST(ReasoningThenToolCalls, RandomOutputsAreChunkingIndependent) {
  const std::vector<std::string> pieces = {
      "<think>", "</think>", "<|channel>", "<channel|>",  "thought",      "\n", " ",
      "x",       "[THINK]",  "[/THINK]",   "<tool_call>", "</tool_call>", "<",  "</th"};
  std::mt19937 rng(11);
  for (ReasoningFormat r :
       {ReasoningFormat::Think, ReasoningFormat::GemmaChannel, ReasoningFormat::MistralThink}) {
    for (bool starts_in : {false, true}) {
      for (int n = 0; n < 300; ++n) {
        std::string text;
        const int len = 1 + int(rng() % 20);
        for (int i = 0; i < len; ++i) text += pieces[rng() % pieces.size()];
        auto all = [&](size_t max_step) {
          ChatOutputParser p(r, starts_in, ToolCallFormat::Hermes);
          ChatDelta out;
          for (size_t at = 0; at < text.size();) {
            const size_t step = max_step == 0 ? text.size() : 1 + rng() % max_step;
            out.append(p.push(std::string_view(text).substr(at, step)));
            at += step;
          }
          out.append(p.flush());
          return std::make_tuple(out.reasoning, out.content, out.calls);
        };
        const auto whole = all(0);
        ASSERT_EQ(all(1), whole) << json(text).dump();
        ASSERT_EQ(all(5), whole) << json(text).dump();
      }
    }
  }
}

}  // namespace

// ---- Llama 3.2 pythonic ----

TEST(ToolCallParser, PythonicCalls) {
  constexpr ToolCallFormat Py = ToolCallFormat::Pythonic;
  expect_parse(Py, "[get_weather(city='San Francisco', days=2, metric=True)]",
               {"", {call("get_weather", R"({"city":"San Francisco","days":2,"metric":true})")}});
  expect_parse(
      Py, " [search(q=\"a, (b) [c]\", opts={'k': [1, 2.5, None]}), now()]",
      {"", {call("search", R"({"q":"a, (b) [c]","opts":{"k":[1,2.5,null]}})"), call("now", "{}")}});
  expect_parse(Py, "[say(text='it\\'s')]", {"", {call("say", R"({"text":"it's"})")}});
  // Malformed lists, positional arguments, a list later in the answer: content.
  expect_content(Py, "[get_weather(city='Paris'");
  expect_content(Py, "[get_weather('Paris')]");
  expect_content(Py, "[]");
  expect_content(Py, "[1, 2, 3]");
  expect_content(Py, "The list is [f(a=1)]");
  EXPECT_EQ(
      detect_chat_format("Respond as [func_name1(params_name1=params_value1)]", "llama").tools, Py);
}
