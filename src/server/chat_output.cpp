#include "server/chat_output.h"

#include <random>

namespace tandem::server {

namespace {

std::string tool_call_id() {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

}  // namespace

void ChatOut::append(ChatOut o) {
  reasoning += o.reasoning;
  content += o.content;
  for (OutputToolCall& c : o.calls) calls.push_back(std::move(c));
}

ChatOutput::ChatOutput(const ChatOutputConfig& c)
    : parser_(c.reasoning, c.starts_in_reasoning, c.tools, c.stream_arguments),
      parallel_(c.parallel_tool_calls),
      pieces_(c.stream_arguments) {}

ChatOut ChatOutput::push(std::string_view text) {
  return convert(parser_.push(text));
}

ChatOut ChatOutput::finish() {
  return convert(parser_.flush());
}

ChatOut ChatOutput::convert(text::ChatDelta d) {
  ChatOut out{std::move(d.reasoning), std::move(d.content), {}};
  if (pieces_) {
    for (text::ToolCallPiece& p : d.pieces) {
      if (!parallel_ && p.index > 0) continue;
      if (p.first) ids_.push_back(tool_call_id());
      if (size_t(p.index) >= ids_.size()) continue;
      out.calls.push_back(
          {p.index, ids_[size_t(p.index)], std::move(p.name), std::move(p.arguments), p.first});
    }
    return out;
  }
  for (text::ToolCall& c : d.calls) {
    if (!parallel_ && calls_ > 0) break;
    out.calls.push_back({calls_++, tool_call_id(), std::move(c.name), std::move(c.arguments)});
  }
  return out;
}

}  // namespace tandem::server
