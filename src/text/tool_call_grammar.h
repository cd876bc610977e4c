// The grammar of "the output is tool calls" (tool_choice "required" or a
// named function), in a family's own call syntax, for constrained decoding:
//
//   Hermes     <tool_call>\n{"name": "f", "arguments": ARGS}\n</tool_call>, calls
//              separated by "\n"
//   Llama3Json {"name": "f", "parameters": ARGS}, calls separated by "; "
//   Mistral    [TOOL_CALLS]f[ARGS]ARGS per call; or, for tokenizers without
//              [ARGS], [TOOL_CALLS][{"name": "f", "arguments": ARGS}, ...]
//   Gemma4     <|tool_call>call:f{key:VALUE,...}<tool_call|> per call (ARGS
//              in Gemma 4's value syntax, strings between <|"|>)
//
// ARGS is a value valid against the function's `parameters` schema
// (text/json_schema_grammar.h, `pattern` not enforced), any object when it
// has none. Every sentence of the grammar parses (text/tool_call_parser.h)
// into calls of the allowed functions whose arguments validate.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/grammar.h"
#include "text/tool_call_parser.h"

namespace tandem::text {

struct ToolGrammarTool {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON schema; null: any object
  size_t index = 0;                   // its place in the request's tools (error paths)
};

struct ToolGrammarSpec {
  ToolCallFormat format = ToolCallFormat::None;
  std::vector<ToolGrammarTool> tools;  // the functions a call may name
  bool parallel = true;                // false: exactly one call
  std::string prefix;                  // bytes before the first call
  // The grammar's bytes for a marker ("<tool_call>", "[ARGS]", "<|\"|>", ...):
  // a sentinel byte when the marker is one token (the mask then allows that
  // token, not the marker spelled out), else the marker's text.
  std::function<std::string(std::string_view marker)> marker;
  bool mistral_args = true;  // Mistral: the [ARGS] form (else the JSON array form)
};

// Throws SchemaError whose path is "tools[i].function.parameters[.<path>]".
Grammar tool_call_grammar(const ToolGrammarSpec& spec);

}  // namespace tandem::text
