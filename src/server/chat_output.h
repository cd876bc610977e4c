// A chat request's output as the OpenAI API carries it: the model's text
// split by its family's parsers (text/chat_output.h) into reasoning
// (`reasoning_content`), answer (`content`) and tool calls (`tool_calls`,
// each given an id "call_…" and an index), for the non-stream message and
// the stream deltas alike.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/chat_output.h"

namespace tandem::server {

// What the server parses for one request. Off (all text is content, as for
// completions) when the model's format has neither reasoning nor calls.
struct ChatOutputConfig {
  bool enabled = false;
  text::ReasoningFormat reasoning = text::ReasoningFormat::None;
  bool starts_in_reasoning = false;                         // the prompt opened a reasoning block
  text::ToolCallFormat tools = text::ToolCallFormat::None;  // None: calls not parsed
  bool parallel_tool_calls = true;  // false: calls after the first are dropped
  // An OpenAI chat stream: calls come as pieces (their arguments as the
  // model writes them), each call's first piece with its id and name.
  bool stream_arguments = false;
};

// A call, or with stream_arguments a piece of one: the first piece has the
// id and the name (`first`), later ones only more arguments.
struct OutputToolCall {
  int index = 0;
  std::string id;  // "call_" + 24 random letters and digits
  std::string name;
  std::string arguments;  // a JSON object, as text (a piece of it)
  bool first = true;
};

struct ChatOut {
  std::string reasoning;
  std::string content;
  std::vector<OutputToolCall> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  void append(ChatOut o);
};

class ChatOutput {
 public:
  explicit ChatOutput(const ChatOutputConfig& c);
  ChatOut push(std::string_view text);
  // End of the output: what the parsers still held.
  ChatOut finish();
  int calls() const { return pieces_ ? int(ids_.size()) : calls_; }

 private:
  ChatOut convert(text::ChatDelta d);

  text::ChatOutputParser parser_;
  bool parallel_;
  bool pieces_;
  int calls_ = 0;
  std::vector<std::string> ids_;  // per call index, for its pieces
};

}  // namespace tandem::server
