// Reasoning separation (text/reasoning_parser.h) on outputs written the way
// each family's template renders them: whole, split at every byte, one byte
// at a time — always the same reasoning and content.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "text/chat_output.h"
#include "text/reasoning_parser.h"

using namespace tandem::text;

namespace {

struct Split {
  std::string reasoning, content;
  bool operator==(const Split&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Split& s) {
  return os << "{reasoning: " << nlohmann::json(s.reasoning).dump()
            << ", content: " << nlohmann::json(s.content).dump() << "}";
}

Split run(ReasoningFormat f, bool starts_in, const std::vector<std::string_view>& chunks) {
  ReasoningParser p(f, starts_in);
  Split s;
  for (std::string_view c : chunks) {
    ReasoningDelta d = p.push(c);
    s.reasoning += d.reasoning;
    s.content += d.content;
  }
  ReasoningDelta d = p.flush();
  s.reasoning += d.reasoning;
  s.content += d.content;
  return s;
}

// The whole text, then every two-chunk split and byte-by-byte chunks: the
// same result each time, which must be `want`.
void expect_split(ReasoningFormat f, bool starts_in, const std::string& text, const Split& want) {
  SCOPED_TRACE(nlohmann::json(text).dump());
  EXPECT_EQ(run(f, starts_in, {text}), want);
  for (size_t i = 0; i <= text.size(); ++i) {
    const std::string_view t = text;
    ASSERT_EQ(run(f, starts_in, {t.substr(0, i), t.substr(i)}), want) << "split at byte " << i;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  EXPECT_EQ(run(f, starts_in, bytes), want) << "byte by byte";
}

TEST(ReasoningParser, Qwen3ThinkBlockAtTheStart) {
  // Qwen3 with thinking on: the template's generation prompt is
  // "<|im_start|>assistant\n" and the model opens the block itself.
  expect_split(ReasoningFormat::Think, false,
               "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is **4**.",
               {"The user wants 2+2. That is 4.", "The answer is **4**."});
  // Leading newlines before the block, and an empty block (what Qwen3 writes
  // for trivial questions).
  expect_split(ReasoningFormat::Think, false, "\n<think>\n\n</think>\n\nHello!", {"", "Hello!"});
  // Reasoning with inner blank lines keeps them.
  expect_split(ReasoningFormat::Think, false, "<think>\nFirst.\n\nSecond.\n</think>\n\nDone.",
               {"First.\n\nSecond.", "Done."});
}

TEST(ReasoningParser, Qwen3OutputThatStartsInsideThinking) {
  // Templates that put "<think>\n" in the prompt: the output has only the
  // closing marker.
  expect_split(ReasoningFormat::Think, true,
               "Okay, the user greets me. I'll greet back.\n</think>\n\nHi there!",
               {"Okay, the user greets me. I'll greet back.", "Hi there!"});
  EXPECT_TRUE(prompt_opens_reasoning(ReasoningFormat::Think, "<|im_start|>assistant\n<think>\n"));
  // enable_thinking=false writes an empty, closed block: the output is the answer.
  EXPECT_FALSE(prompt_opens_reasoning(ReasoningFormat::Think,
                                      "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning(ReasoningFormat::Think, "<|im_start|>assistant\n"));
  expect_split(ReasoningFormat::Think, false, "The answer is 4.", {"", "The answer is 4."});
}

TEST(ReasoningParser, ThinkingNeverLeaksIntoContent) {
  // Cut off by max_tokens inside the block: all of it is reasoning.
  expect_split(ReasoningFormat::Think, false, "<think>\nLet me consider the options: first",
               {"Let me consider the options: first", ""});
  expect_split(ReasoningFormat::Think, true, "Still thinking about </thi",
               {"Still thinking about </thi", ""});
  // Half a marker at the very end stays where it is.
  expect_split(ReasoningFormat::Think, false, "<thi", {"", "<thi"});
}

TEST(ReasoningParser, Qwen3ThinkOnlyAtTheStart) {
  // Later mentions of the tag are the answer's text (Qwen3's <think> is not
  // a special token: users can ask about it).
  expect_split(ReasoningFormat::Think, false, "Wrap it in <think> and </think> tags.",
               {"", "Wrap it in <think> and </think> tags."});
  expect_split(ReasoningFormat::Think, false, "<think>a</think>b<think>c</think>",
               {"a", "b<think>c</think>"});
}

TEST(ReasoningParser, Gemma4Channels) {
  // Gemma 4 with enable_thinking: a "thought" channel, then the answer.
  expect_split(ReasoningFormat::GemmaChannel, false,
               "<|channel>thought\nThe user wants a haiku about autumn. Five, seven, "
               "five.<channel|>Autumn moonlight—\na worm digs silently\ninto the chestnut.",
               {"The user wants a haiku about autumn. Five, seven, five.",
                "Autumn moonlight—\na worm digs silently\ninto the chestnut."});
  // The empty channel the model may still write with thinking off.
  expect_split(ReasoningFormat::GemmaChannel, false, "<|channel>thought\n<channel|>Hello!",
               {"", "Hello!"});
  expect_split(ReasoningFormat::GemmaChannel, false, "<|channel>thought<channel|>Hi", {"", "Hi"});
  // A block after some text (channels can open anywhere).
  expect_split(ReasoningFormat::GemmaChannel, false,
               "Sure.<|channel>thought\nCheck the date.<channel|>It is Monday.",
               {"Check the date.", "Sure.It is Monday."});
  // No name line: the whole block is reasoning.
  const std::string long_block = "<|channel>" + std::string(40, 'x') + "<channel|>ok";
  expect_split(ReasoningFormat::GemmaChannel, false, long_block, {std::string(40, 'x'), "ok"});
  // Prompts: the disabled-thinking generation prompt closes its channel.
  EXPECT_FALSE(prompt_opens_reasoning(ReasoningFormat::GemmaChannel,
                                      "<|turn>model\n<|channel>thought\n<channel|>"));
  EXPECT_TRUE(
      prompt_opens_reasoning(ReasoningFormat::GemmaChannel, "<|turn>model\n<|channel>thought\n"));
  expect_split(ReasoningFormat::GemmaChannel, true, "Count the letters.<channel|>Five.",
               {"Count the letters.", "Five."});
}

TEST(ReasoningParser, MistralThink) {
  expect_split(ReasoningFormat::MistralThink, false,
               "[THINK]5000 m is 5 km.[/THINK]It is **5 km**.",
               {"5000 m is 5 km.", "It is **5 km**."});
}

TEST(ReasoningParser, NoneIsAllContent) {
  expect_split(ReasoningFormat::None, false, "<think>x</think> y", {"", "<think>x</think> y"});
}

// The formats chosen from the real templates (tests/fixtures/templates).
TEST(ChatFormat, DetectedFromTheRealTemplates) {
  auto tpl = [](const std::string& name) {
    std::ifstream f(tandem::test::source_dir() + "/tests/fixtures/templates/" + name + ".json");
    return nlohmann::json::parse(f)["chat_template"].get<std::string>();
  };
  using R = ReasoningFormat;
  using T = ToolCallFormat;
  EXPECT_EQ(detect_chat_format(tpl("qwen3"), ""), (ChatFormat{R::Think, T::Hermes}));
  EXPECT_EQ(detect_chat_format(tpl("gemma4_e2b"), ""), (ChatFormat{R::GemmaChannel, T::Gemma4}));
  EXPECT_EQ(detect_chat_format(tpl("gemma4"), ""), (ChatFormat{R::GemmaChannel, T::Gemma4}));
  EXPECT_EQ(detect_chat_format(tpl("ministral3"), ""), (ChatFormat{R::None, T::Mistral}));
  EXPECT_EQ(detect_chat_format(tpl("llama3_2"), ""), (ChatFormat{R::None, T::Llama3Json}));
  EXPECT_EQ(detect_chat_format(tpl("gemma3"), "gemma3_text"), (ChatFormat{}));
  // The plain Llama 3 template shows no calls: model_type decides.
  EXPECT_EQ(detect_chat_format(tpl("llama3_1"), ""), (ChatFormat{}));
  EXPECT_EQ(detect_chat_format(tpl("llama3_1"), "llama"), (ChatFormat{R::None, T::Llama3Json}));
  EXPECT_EQ(detect_chat_format("", "qwen3"), (ChatFormat{R::Think, T::Hermes}));
}

}  // namespace
