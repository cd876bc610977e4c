#include "text/chat_output.h"

namespace tandem::text {

namespace {

bool has(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view tpl, std::string_view model_type) {
  ChatFormat f;
  if (has(tpl, "<|tool_call>"))
    f.tools = ToolCallFormat::Gemma4;
  else if (has(tpl, "func_name1(") || has(tpl, "[func_name("))  // a pythonic template
    f.tools = ToolCallFormat::Pythonic;
  else if (has(tpl, "[TOOL_CALLS]"))
    f.tools = ToolCallFormat::Mistral;
  else if (has(tpl, "<tool_call>"))
    f.tools = ToolCallFormat::Hermes;
  else if (has(tpl, "<|python_tag|>") ||
           (has(tpl, "<|start_header_id|>") && has(tpl, "\"parameters\"")))
    f.tools = ToolCallFormat::Llama3Json;

  if (has(tpl, "<|channel>"))
    f.reasoning = ReasoningFormat::GemmaChannel;
  else if (has(tpl, "</think>"))
    f.reasoning = ReasoningFormat::Think;
  else if (has(tpl, "[THINK]"))
    f.reasoning = ReasoningFormat::MistralThink;

  const std::string_view t = model_type;
  if (f.tools == ToolCallFormat::None) {
    if (t.starts_with("qwen2") || t.starts_with("qwen3"))
      f.tools = ToolCallFormat::Hermes;
    else if (t == "llama")
      f.tools = ToolCallFormat::Llama3Json;
    else if (t.starts_with("mistral") || t.starts_with("ministral"))
      f.tools = ToolCallFormat::Mistral;
    else if (t.starts_with("gemma4"))
      f.tools = ToolCallFormat::Gemma4;
  }
  if (f.reasoning == ReasoningFormat::None) {
    if (t.starts_with("qwen3"))
      f.reasoning = ReasoningFormat::Think;
    else if (t.starts_with("gemma4"))
      f.reasoning = ReasoningFormat::GemmaChannel;
  }
  return f;
}

std::vector<std::string> reasoning_markers(ReasoningFormat f) {
  switch (f) {
    case ReasoningFormat::None: return {};
    case ReasoningFormat::Think: return {"<think>", "</think>"};
    case ReasoningFormat::GemmaChannel: return {"<|channel>", "<channel|>"};
    case ReasoningFormat::MistralThink: return {"[THINK]", "[/THINK]"};
  }
  return {};
}

std::vector<std::string> tool_call_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::None: return {};
    case ToolCallFormat::Hermes: return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::Llama3Json: return {"<|python_tag|>"};
    case ToolCallFormat::Mistral: return {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"};
    case ToolCallFormat::Gemma4:
      return {"<|tool_call>", "<tool_call|>", "<|\"|>", "<|tool_response>"};
    case ToolCallFormat::Pythonic: return {};
  }
  return {};
}

std::vector<std::string> tool_call_stops(ToolCallFormat f) {
  if (f == ToolCallFormat::Gemma4) return {"<|tool_response>"};
  return {};
}

void ChatDelta::append(ChatDelta d) {
  reasoning += d.reasoning;
  content += d.content;
  for (ToolCall& c : d.calls) calls.push_back(std::move(c));
  for (ToolCallPiece& p : d.pieces) pieces.push_back(std::move(p));
}

ChatOutputParser::ChatOutputParser(ReasoningFormat reasoning, bool starts_in_reasoning,
                                   ToolCallFormat tools, bool stream_arguments)
    : reasoning_(reasoning, starts_in_reasoning), tools_(tools, stream_arguments) {}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ReasoningDelta r = reasoning_.push(text);
  ToolCallDelta t = tools_.push(r.content);
  return {std::move(r.reasoning), std::move(t.content), std::move(t.calls), std::move(t.pieces)};
}

ChatDelta ChatOutputParser::flush() {
  ReasoningDelta r = reasoning_.flush();
  ToolCallDelta t = tools_.push(r.content);
  ToolCallDelta end = tools_.flush();
  t.content += end.content;
  for (ToolCall& c : end.calls) t.calls.push_back(std::move(c));
  for (ToolCallPiece& p : end.pieces) t.pieces.push_back(std::move(p));
  return {std::move(r.reasoning), std::move(t.content), std::move(t.calls), std::move(t.pieces)};
}

}  // namespace tandem::text
