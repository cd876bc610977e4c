// Tool calls in a model's generated text, parsed incrementally per family:
//
//   Hermes     <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Qwen3,
//              Qwen2.5; several in a row)
//   Llama3Json {"name": "f", "parameters": {...}} at the start of the output,
//              several separated by ";" (Llama 3.1/3.2); or after <|python_tag|>
//   Mistral    [TOOL_CALLS]f[ARGS]{...} (tekken v11+, one marker per call;
//              [CALL_ID]x before [ARGS] is accepted) or
//              [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (older)
//   Gemma4     <|tool_call>call:f{key:<|"|>text<|"|>,n:1,xs:[...]}<tool_call|>
//              (strings between <|"|> tokens, bare keys)
//   Pythonic   [f(a=1, b="x"), g()] as the whole answer (Llama 3.2 with a
//              pythonic template: text/pythonic_calls.h)
//
// Mistral's and Gemma 4's markers are special tokens: the text stream must
// keep them (GenerationParams::keep_special).
//
// Contract:
//  - A call is given out once it is complete and valid: its arguments are a
//    JSON object, given out as compact JSON text (an object the model wrote
//    as such: its text with the whitespace between JSON tokens removed). "arguments" may also be
//    named "parameters", may be a string holding a JSON object, and may be
//    absent ({}).
//  - A malformed call (not JSON, no name, arguments not an object, never
//    closed before the end of the output) is content: its text, markers
//    included, exactly as the model wrote it — never an error.
//  - Whitespace between content and a call, between calls and after the last
//    call is dropped; other text around calls is content.
//  - Splitting the input anywhere gives the same content and calls as one
//    push of the whole text (text that may start a call is held back until
//    the following text decides).
// Not thread-safe (one per request).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tool_call_stream.h"

namespace tandem::text {

enum class ToolCallFormat { None, Hermes, Llama3Json, Mistral, Gemma4, Pythonic };

const char* tool_call_format_name(ToolCallFormat f);  // "none", "hermes", ...

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, compact
  bool operator==(const ToolCall&) const = default;
};

// A piece of a call, for streams: a call's first piece names it, later
// ones add to its arguments; a call's pieces concatenate to its arguments.
struct ToolCallPiece {
  int index = 0;     // the call's place among the output's calls
  std::string name;  // the first piece only
  std::string arguments;
  bool first = false;
  bool operator==(const ToolCallPiece&) const = default;
};

struct ToolCallDelta {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallPiece> pieces;  // with stream_arguments only
  bool empty() const { return content.empty() && calls.empty() && pieces.empty(); }
};

class ToolCallParser {
 public:
  // `stream_arguments`: also give out pieces (text/tool_call_stream.h). In
  // the JSON-argument formats (Hermes, Llama 3 JSON, Mistral's [ARGS]) a
  // call whose name comes first is given out as soon as its arguments
  // object opens, then its arguments as the model writes them; such a call
  // is committed: if it turns out malformed later (never closed, bad JSON),
  // it stays a call with the arguments given so far, and its text is not
  // content (as vLLM does). Other calls come as one piece once complete.
  explicit ToolCallParser(ToolCallFormat format, bool stream_arguments = false);

  ToolCallDelta push(std::string_view text);
  // End of output: held-back text, and an unfinished call as content.
  ToolCallDelta flush();

  ToolCallFormat format() const { return format_; }
  int calls() const { return calls_; }

 private:
  void run(ToolCallDelta& out, bool at_end);
  bool scan_text(ToolCallDelta& out, bool at_end);
  bool scan_call(ToolCallDelta& out, bool at_end);
  void emit(std::string_view text, ToolCallDelta& out);
  void malformed(size_t raw_end, ToolCallDelta& out);
  void completed(std::vector<ToolCall> calls, size_t raw_end, ToolCallDelta& out);
  size_t json_extent(std::string_view s, size_t start);

  // Where the open call's scans stopped (reset when a call opens).
  struct JsonScan {
    size_t start = std::string::npos, pos = 0;
    int depth = 0;
    bool in_string = false, escaped = false;
  };
  JsonScan scan_;
  size_t searched_ = 0;

  // The open call's head and arguments so far (text/tool_call_stream.h).
  struct Streamed {
    CallHead head;
    JsonMinifier minifier;
    size_t pos = 0;          // buf_ index the minifier has read to
    std::string args;        // the arguments' minified text so far
    bool committed = false;  // its first piece was given out
  };
  void stream_call(ToolCallDelta& out);
  Streamed st_;
  bool stream_args_ = false;  // the close (or next) marker is not before this

  ToolCallFormat format_;
  std::string marker_;       // the text that opens a call
  bool in_call_ = false;     // buf_ starts with an opened call (its marker included)
  bool at_start_ = true;     // Llama3Json: no content yet, so "{" may open a call
  bool drop_space_ = false;  // whitespace after a call is dropped
  std::string held_space_;   // trailing whitespace of the content, until decided
  std::string buf_;
  int calls_ = 0;
};

// Gemma 4's argument syntax as JSON: {key:value,...} with bare (or quoted)
// keys, strings between <|"|> (or JSON strings), numbers, true/false,
// null/None, arrays. nullopt when it is not exactly one such value.
std::optional<nlohmann::ordered_json> parse_gemma4_value(std::string_view text);

// The call described by a JSON object {"name": ..., "arguments" | "parameters": ...}
// (Hermes, Llama, Mistral's array form); nullopt when it is not one.
std::optional<ToolCall> tool_call_from_json(const nlohmann::ordered_json& j);

// An unquoted scalar as models write it in JSON-ish or Python-ish calls:
// true/True, false/False, null/None, or a JSON number. False (out untouched)
// for anything else.
bool parse_bare_scalar(std::string_view word, nlohmann::ordered_json& out);

}  // namespace tandem::text
