// tool_choice "required" and named functions, enforced by constrained
// decoding: the output must be one call (parallel_tool_calls false) or
// several, in the model's own call syntax, each naming an allowed function
// (the named one, or any of `tools`) with arguments valid against its
// `parameters` schema (text/tool_call_grammar.h).
//
// Marker tokens (<tool_call>, [TOOL_CALLS], <|tool_call>, <|"|>, ...) stand
// in the grammar as sentinel bytes (0xF8 + k, never in UTF-8 text) that only
// the marker's own token writes, so the mask allows the special token and
// not the marker spelled out in pieces. The vocabulary with those sentinels
// is built once per tokenizer and format.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "engine/constraint.h"
#include "server/chat_output.h"
#include "server/openai_request.h"
#include "server/prompt_builder.h"

namespace tandem::server {

// Whether a request's tool_choice must be enforced (required or named).
bool tool_choice_forced(const OpenAIRequest& r);

// The constraint for a forced tool_choice. `tools` is the request's tools
// with the client's key order; `output` says the model's call format and
// whether the prompt opened a reasoning block (then the output first
// closes it). Throws ApiError 400: the model's call format is unknown
// (param tool_choice), or a tool's schema cannot be compiled (param
// tools[i].function.parameters.<path>).
std::shared_ptr<const ConstraintFactory> tool_choice_constraint(const OpenAIRequest& r,
                                                                const nlohmann::ordered_json& tools,
                                                                const ChatOutputConfig& output,
                                                                PromptBuilder& builder);

}  // namespace tandem::server
