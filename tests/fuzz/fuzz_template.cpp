// libFuzzer target for the chat-template engine: the input is a template
// (optionally followed by a NUL byte and a JSON messages array). Whatever the
// bytes, parsing and rendering must end in output or a tandem::Error — never
// a crash, a sanitizer report, a hang or unbounded memory.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "text/chat_template.h"

namespace {

const char* const kMessages = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi é 😀"}]},
  {"role": "assistant", "content": "", "reasoning_content": "think",
   "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true], "b": {"c": "d"}}}}]},
  {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "{\"ok\": 1}"},
  {"role": "user", "content": "again"}
])";

const char* const kTools = R"([{"type": "function", "function": {"name": "f", "description": "d",
  "parameters": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "number"}}},
                 "required": ["a"]}}}])";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  std::string source = input, messages_json = kMessages;
  if (size_t nul = input.find('\0'); nul != std::string::npos) {
    source = input.substr(0, nul);
    messages_json = input.substr(nul + 1);
  }
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(messages_json, nullptr, false);
  if (messages.is_discarded() || !messages.is_array()) messages = nlohmann::ordered_json::array();
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(kTools);
  tandem::jinja::RenderOptions opts;
  opts.limits.max_steps = 200000;
  opts.limits.max_output_bytes = size_t(1) << 20;
  opts.limits.max_call_depth = 64;
  opts.clock = [] { return std::tm{}; };
  try {
    tandem::ChatTemplate t = tandem::ChatTemplate::from_string(source, {{"bos_token", "<s>"}});
    t.render(messages, tools, true, nlohmann::ordered_json{{"enable_thinking", true}}, opts);
  } catch (const tandem::Error&) {
  }
  return 0;
}
