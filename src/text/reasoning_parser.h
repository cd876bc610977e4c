// Reasoning separation: splits a model's generated text, incrementally, into
// its reasoning ("thinking") and its answer, for the families that write
// reasoning inline:
//
//   Think        <think>REASONING</think>ANSWER                 (Qwen3; one block,
//                at the start of the output, or opened by the prompt itself)
//   GemmaChannel <|channel>thought\nREASONING<channel|>ANSWER   (Gemma 4; the
//                channel name line is dropped; blocks anywhere)
//   MistralThink [THINK]REASONING[/THINK]ANSWER                 (Magistral-style
//                tekken tokenizers; blocks anywhere)
//
// Gemma 4's and Mistral's markers are special tokens: the text stream must
// keep them (GenerationParams::keep_special) for this parser to see them.
//
// Contract:
//  - push() returns what can be told now; text that may still be the start of
//    a marker is held back until the following text decides, so splitting the
//    input anywhere (between any two bytes) gives the same concatenated
//    output as one push of the whole text.
//  - Reasoning never reaches `content`: a block that is never closed (the
//    output ran out) stays reasoning to the end.
//  - Whitespace: reasoning is trimmed at both ends, and the answer after a
//    block loses its leading whitespace (templates add "\n\n" there).
//  - Markers are consumed; the text between blocks is content unchanged.
// Not thread-safe (one per request).
#pragma once

#include <string>
#include <string_view>

namespace tandem::text {

enum class ReasoningFormat { None, Think, GemmaChannel, MistralThink };

const char* reasoning_format_name(ReasoningFormat f);  // "none", "think", ...

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReasoningParser {
 public:
  // `starts_in_reasoning`: the prompt already opened a block (see
  // prompt_opens_reasoning), so the output begins inside it.
  explicit ReasoningParser(ReasoningFormat format, bool starts_in_reasoning = false);

  ReasoningDelta push(std::string_view text);
  // End of output: everything still held back.
  ReasoningDelta flush();

  ReasoningFormat format() const { return format_; }

 private:
  enum class State { Start, Content, Header, Reasoning, AfterClose };
  void run(ReasoningDelta& out, bool at_end);

  ReasoningFormat format_;
  std::string open_, close_;
  bool anywhere_ = false;  // blocks may open anywhere, not only at the start
  bool named_ = false;     // a channel name line follows the open marker
  State state_ = State::Content;
  bool block_started_ = false;  // the current block has shown non-space text
  std::string buf_;
};

// Whether a rendered prompt ends inside an open reasoning block (Qwen3
// templates that write "<think>\n" after the generation prompt; a prompt
// ending with an empty closed block, as with enable_thinking=false, does not).
// `prompt_tail` is the end of the prompt's text, special tokens included.
bool prompt_opens_reasoning(ReasoningFormat format, std::string_view prompt_tail);

}  // namespace tandem::text
