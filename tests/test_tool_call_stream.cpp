// Tool-call arguments streamed in pieces (ToolCallParser with
// stream_arguments, text/tool_call_stream.h): for every chunking of recorded
// outputs, the pieces of each call concatenate to the arguments the
// non-stream parse gives, the first piece of a call names it, content is
// the same, and a call that breaks after its first piece stays a call.
#include <gtest/gtest.h>

#include <random>

#include "text/tool_call_parser.h"
#include "text/tool_call_stream.h"

using namespace tandem::text;

namespace {

struct Streamed {
  std::string content;
  std::vector<std::string> names, arguments;
  size_t pieces = 0;
  int calls = 0;
};

Streamed stream(ToolCallFormat f, const std::vector<std::string>& chunks) {
  ToolCallParser p(f, /*stream_arguments=*/true);
  Streamed s;
  auto take = [&](ToolCallDelta d) {
    s.content += d.content;
    for (const ToolCallPiece& piece : d.pieces) {
      ++s.pieces;
      if (piece.first) {
        EXPECT_EQ(size_t(piece.index), s.names.size());
        EXPECT_FALSE(piece.name.empty());
        s.names.push_back(piece.name);
        s.arguments.emplace_back();
      } else {
        EXPECT_TRUE(piece.name.empty());
      }
      ASSERT_LT(size_t(piece.index), s.arguments.size());
      s.arguments[size_t(piece.index)] += piece.arguments;
    }
  };
  for (const std::string& c : chunks) take(p.push(c));
  take(p.flush());
  s.calls = p.calls();
  return s;
}

ToolCallDelta whole(ToolCallFormat f, const std::string& text) {
  ToolCallParser p(f);
  ToolCallDelta d = p.push(text);
  ToolCallDelta e = p.flush();
  d.content += e.content;
  d.calls.insert(d.calls.end(), e.calls.begin(), e.calls.end());
  return d;
}

std::vector<std::string> random_chunks(const std::string& s, std::mt19937& rng) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = 1 + rng() % 6;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

struct Case {
  ToolCallFormat format;
  std::string text;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {ToolCallFormat::Hermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris \\\"centre\\\" {x}\", \"days\": [1, 2,\n 3], \"deep\": {\"a\": null}}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>"},
      // Arguments before the name: given whole once complete.
      {ToolCallFormat::Hermes,
       "<tool_call>\n{\"arguments\": {\"q\": 1}, \"name\": \"late\"}\n</tool_call>"},
      {ToolCallFormat::Hermes,
       "<tool_call>\n{\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 1}\"}\n</tool_call>"},
      {ToolCallFormat::Llama3Json,
       "{\"name\": \"search\", \"parameters\": {\"query\": \"tandem  server\", \"n\": 3}}; "
       "{\"name\": \"open\", \"parameters\": {\"id\": \"x\"}}"},
      {ToolCallFormat::Mistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}"
       "[TOOL_CALLS]get_time[CALL_ID]abc123456[ARGS]{\"tz\": \"Europe/Paris\"}"},
      {ToolCallFormat::Mistral,
       "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
       "\"arguments\": {}}]"},
      {ToolCallFormat::Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"},
  };
  return c;
}

}  // namespace

TEST(ToolCallStream, PiecesJoinToTheNonStreamCallsForEveryChunking) {
  std::mt19937 rng(7);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.text);
    const ToolCallDelta ref = whole(c.format, c.text);
    ASSERT_FALSE(ref.calls.empty());
    std::vector<std::vector<std::string>> chunkings = {{c.text}};
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.emplace_back(1, ch);
    chunkings.push_back(bytes);
    for (int k = 0; k < 20; ++k) chunkings.push_back(random_chunks(c.text, rng));
    for (const auto& chunks : chunkings) {
      const Streamed s = stream(c.format, chunks);
      EXPECT_EQ(s.content, ref.content);
      ASSERT_EQ(s.names.size(), ref.calls.size());
      EXPECT_EQ(s.calls, int(ref.calls.size()));
      for (size_t i = 0; i < ref.calls.size(); ++i) {
        EXPECT_EQ(s.names[i], ref.calls[i].name);
        EXPECT_EQ(s.arguments[i], ref.calls[i].arguments);
      }
    }
  }
  // Byte by byte, a JSON-argument call streams in many pieces; the others
  // come whole.
  const std::vector<std::string> first_case = [] {
    std::vector<std::string> b;
    for (char ch : cases()[0].text) b.emplace_back(1, ch);
    return b;
  }();
  EXPECT_GT(stream(ToolCallFormat::Hermes, first_case).pieces, 20u);
  EXPECT_EQ(whole(ToolCallFormat::Hermes, cases()[0].text).calls[0].arguments,
            R"({"city":"Paris \"centre\" {x}","days":[1,2,3],"deep":{"a":null}})");
}

TEST(ToolCallStream, ACallThatBreaksAfterItsFirstPieceStaysACall) {
  // The output ends inside the arguments: the stream had named the call, so
  // it stays one (its arguments as far as they went); the non-stream parse
  // of the same text makes it content.
  const std::string cut = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": ";
  const Streamed s = stream(ToolCallFormat::Hermes, {cut.substr(0, 30), cut.substr(30)});
  EXPECT_EQ(s.content, "Sure.");
  ASSERT_EQ(s.names.size(), 1u);
  EXPECT_EQ(s.names[0], "f");
  EXPECT_EQ(s.arguments[0], R"({"a":1,"b":)");
  EXPECT_EQ(s.calls, 1);
  const ToolCallDelta w = whole(ToolCallFormat::Hermes, cut);
  EXPECT_EQ(w.content, cut);
  EXPECT_TRUE(w.calls.empty());
  // Broken before the name is known: content, never a piece.
  const Streamed early = stream(ToolCallFormat::Hermes, {"<tool_call>\n{\"nam", "e\" \"f\"}"});
  EXPECT_EQ(early.pieces, 0u);
  EXPECT_EQ(early.content, "<tool_call>\n{\"name\" \"f\"}");
  // Bad JSON after the first piece: the call keeps what was streamed; text
  // after it is still content.
  const Streamed after =
      stream(ToolCallFormat::Mistral, {"[TOOL_CALLS]f[ARGS]{\"a\": tru", "x} oops"});
  ASSERT_EQ(after.names.size(), 1u);
  EXPECT_EQ(after.arguments[0], R"({"a":trux})");
  EXPECT_EQ(after.content, "oops");
}

TEST(ToolCallStream, MinifierAndHeads) {
  EXPECT_EQ(minify_json("{ \"a b\" : [1, 2 ,\n3], \"c\\\" d\": \"x \\\\\" }"),
            R"({"a b":[1,2,3],"c\" d":"x \\"})");
  EXPECT_EQ(json_call_head(R"({"name": "f", "arguments": {)", 0).state, CallHead::Found);
  EXPECT_EQ(json_call_head(R"({"name": "f", "argu)", 0).state, CallHead::NeedMore);
  EXPECT_EQ(json_call_head(R"({"arguments": {}, "name": "f"})", 0).state, CallHead::NotStreamable);
  EXPECT_EQ(json_call_head(R"({"name": "f", "arguments": "{}"})", 0).state,
            CallHead::NotStreamable);
  const CallHead m = mistral_call_head("[TOOL_CALLS]get[CALL_ID]x1[ARGS] {", 12, std::string::npos);
  EXPECT_EQ(m.state, CallHead::Found);
  EXPECT_EQ(m.name, "get");
}
