// OpenAI request bodies -> validated requests.
//
// Contract: every field the server understands is checked for type and range,
// and a bad one throws ApiError 400 naming it in `param` (nested fields as
// `messages[2].content[0].text`); unknown fields are ignored (clients send
// extras). Fields that would silently change the meaning of a request if
// ignored (`echo`, `best_of` > 1, `suffix`) are refused instead. The full field table is in
// docs/api.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/errors.h"
#include "server/structured_output.h"

namespace tandem::server {

enum class Endpoint { Completions, Chat };

// The most choices (`n`) one request may ask for.
inline constexpr int32_t kMaxChoices = 16;

// `tool_choice`: auto (the default), none (the template gets no tools and
// the output is not parsed for calls), required, or one named function
// (both enforced by constrained decoding: server/tool_choice.h).
struct ToolChoice {
  enum class Mode { Auto, None, Required, Named };
  Mode mode = Mode::Auto;
  std::string name;  // Named: the function
};

struct OpenAIRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::optional<std::string> model;  // absent: the served model

  // Completions: one prompt or a batch (up to kMaxChoices), each token ids
  // or text (which needs a tokenizer).
  struct CompletionPrompt {
    std::vector<int32_t> ids;
    std::optional<std::string> text;
  };
  std::vector<CompletionPrompt> prompts;

  // Chat: validated as described in prompt_builder.h; null when absent.
  json messages;
  json tools;
  json chat_template_kwargs;
  bool has_images = false;  // some message has an image_url part
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;  // false: at most one call is returned
  // The request's thinking switch: chat_template_kwargs.enable_thinking
  // when it is a boolean, else the top-level `enable_thinking` (extension);
  // nullopt: the server's default.
  std::optional<bool> enable_thinking;
  // `thinking_budget` (extension; Anthropic's thinking.budget_tokens): the
  // most tokens the reasoning block may take before its closing marker is
  // forced (server/reasoning_budget.h).
  std::optional<int32_t> thinking_budget;

  // Sampling, max_tokens, stop, logprobs, ignore_eos, timeout. max_tokens is
  // the requested value (default 16 for completions, "until the context is
  // full" for chat), clipped to INT32_MAX; the engine stops at the end of the
  // context with finish_reason "length" either way.
  GenerationParams params;
  bool seed_given = false;
  // `n`: choices to generate for the prompt (1..kMaxChoices), each its own
  // engine sequence; choice i samples with seed + i.
  int32_t n = 1;

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage

  // Logprobs as the client asked for them. Completions: `logprobs` is the
  // number of alternatives (0..20). Chat: `logprobs` true, `top_logprobs`
  // 0..20. Either way params.top_logprobs is -1 (off) or the count.
  bool logprobs = false;

  // response_format (both endpoints): text (the default), json_object, or
  // json_schema; the shape is checked here, the schema is compiled by
  // server/structured_output.h (with the body's key order).
  ResponseFormat response_format;
};

// Parses the raw body: it must be valid UTF-8 JSON holding an object.
// Throws ApiError 400 (invalid_utf8 / invalid_json / invalid_type).
json parse_json_body(const std::string& body);

// Validate a parsed body. `max_timeout_s` clips the per-request `timeout`.
OpenAIRequest parse_completion_request(const json& body, double max_timeout_s);
OpenAIRequest parse_chat_request(const json& body, double max_timeout_s);

}  // namespace tandem::server
