// A chat model's output as the API gives it: reasoning, answer text and tool
// calls, split incrementally (text/reasoning_parser.h, then
// text/tool_call_parser.h on the answer), and which formats a model writes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/reasoning_parser.h"
#include "text/tool_call_parser.h"

namespace tandem::text {

struct ChatFormat {
  ReasoningFormat reasoning = ReasoningFormat::None;
  ToolCallFormat tools = ToolCallFormat::None;
  bool operator==(const ChatFormat&) const = default;
};

// The formats a model writes, read from its chat template (which renders
// past reasoning and calls the way the model was trained to write them);
// where the template shows none, from config.json's model_type (qwen3:
// Hermes calls and <think>; qwen2: Hermes; llama: Llama 3 JSON; mistral*,
// ministral*: Mistral; gemma4*: Gemma 4 calls and channels).
ChatFormat detect_chat_format(std::string_view template_source, std::string_view model_type);

// The markers of a format, as text. Some tokenizers make them special
// tokens, which a text stream skips unless told to keep them.
std::vector<std::string> reasoning_markers(ReasoningFormat f);
std::vector<std::string> tool_call_markers(ToolCallFormat f);
// Stop strings that end the model's turn after its calls: Gemma 4 writes
// <|tool_response>, then would go on to imagine the tool's answer.
std::vector<std::string> tool_call_stops(ToolCallFormat f);

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallPiece> pieces;  // stream_arguments only (text/tool_call_parser.h)
  bool empty() const {
    return reasoning.empty() && content.empty() && calls.empty() && pieces.empty();
  }
  void append(ChatDelta d);
};

// Reasoning first, then tool calls in what is left. The same contract as
// the two parsers: any split of the input gives the same result.
class ChatOutputParser {
 public:
  ChatOutputParser(ReasoningFormat reasoning, bool starts_in_reasoning, ToolCallFormat tools,
                   bool stream_arguments = false);
  ChatDelta push(std::string_view text);
  ChatDelta flush();
  int calls() const { return tools_.calls(); }

 private:
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

}  // namespace tandem::text
