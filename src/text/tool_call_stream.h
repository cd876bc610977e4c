// Streaming a tool call's arguments while the model writes them (the
// JSON-argument formats of text/tool_call_parser.h: Hermes, Llama 3 JSON,
// Mistral's [ARGS] form): where the arguments object starts once the call's
// name is known, and the arguments' text with the whitespace between JSON
// tokens removed, incrementally (so the pieces streamed concatenate to the
// call's final `arguments`).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::text {

// The head of a call: its name and where its arguments object starts.
struct CallHead {
  enum State { NeedMore, Found, NotStreamable };
  State state = NeedMore;
  std::string name;
  size_t args = 0;  // Found: the index of the arguments' '{'
};

// A JSON call object starting at s[open] == '{' whose first member is
// "name" (a string) and second "arguments" or "parameters" (an object):
// Found once the second member's '{' is there. Any other layout (arguments
// first, arguments as a string, ...) is NotStreamable: the call is then
// given whole once complete.
CallHead json_call_head(std::string_view s, size_t open);

// Mistral's NAME[ARGS]{ (or NAME[CALL_ID]ID[ARGS]{) from `from`, the index
// just after [TOOL_CALLS]; `next_marker` bounds it (npos: not yet seen).
CallHead mistral_call_head(std::string_view s, size_t from, size_t next_marker);

// JSON text with the whitespace outside strings removed, fed in pieces;
// stops at the bracket that closes the first value (closed()).
class JsonMinifier {
 public:
  // Consumes s (up to the closing bracket) and returns its minified text;
  // `used` is how many bytes of s were consumed.
  std::string push(std::string_view s, size_t& used);
  bool closed() const { return closed_; }

 private:
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false, closed_ = false;
};

// The whole text minified, as JsonMinifier would stream it.
std::string minify_json(std::string_view s);

}  // namespace tandem::text
