// Engine events -> OpenAI response bodies and server-sent-event chunks.
//
// Shapes (docs/api.md has examples):
//  - non-stream: `text_completion` / `chat.completion` with a choice (n of
//    them, built one by one with ResponseContext::index) and `usage`;
//  - stream: one chunk per engine event with tokens (`text_completion` /
//    `chat.completion.chunk`; the first chat chunk carries the role), then a
//    chunk with `finish_reason`, then — with stream_options.include_usage — a
//    chunk with empty `choices` and `usage`, then `data: [DONE]`. A failure
//    inside a stream ends with finish_reason "error", the usage chunk (if
//    asked for), `data: {"error": {...}}`, `data: [DONE]`.
//
// Extensions (documented in docs/api.md):
//  - `choices[0].token_ids`: the generated token ids (in stream chunks: the
//    ids of that chunk). TEMPORARY role: until the detokenizer lands, `text`
//    / `content` is always "" and these ids are the output.
//  - finish_reason "cancelled" for requests cancelled through
//    POST /v1/requests/{id}/cancel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/chat_output.h"
#include "server/errors.h"
#include "server/openai_request.h"

namespace tandem::server {

inline constexpr const char* kSystemFingerprint = "tandem-0.1.0";
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// How a token is shown in logprobs: the model's PromptBuilder renders its
// text; without a tokenizer, "token_id:<id>" (the convention vLLM uses for
// return_tokens_as_token_ids).
using TokenRenderer = std::function<std::string(int32_t)>;
std::string token_id_text(int32_t id);

struct ResponseContext {
  Endpoint endpoint = Endpoint::Completions;
  std::string id;       // "cmpl-…" or "chatcmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;    // the served model name
  bool logprobs = false;
  bool include_usage = false;  // streams: stream_options.include_usage
  TokenRenderer render = token_id_text;
  ChatOutputConfig output;  // chat: reasoning and tool-call parsing
  int index = 0;            // the choice this context writes (`n` > 1)
};

// A request's whole output, accumulated from its events (non-stream).
struct Generation {
  std::vector<int32_t> ids;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::None;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  ChatOut parsed;  // chat with ResponseContext::output enabled: `text` parsed

  void add(const GenerationEvent& e);
};

// "stop", "length", "error" (Error and Timeout), "cancelled" (extension);
// "tool_calls" for a Stop whose output made tool calls.
const char* finish_reason_text(FinishReason r, bool tool_calls = false);

// The HTTP error a failed request turns into: Error -> 500 internal_error,
// Timeout -> 504 timeout. Only for those two reasons.
ApiError outcome_error(FinishReason r, const std::string& engine_message);

// OpenAI's usage object; cached_tokens (prompt tokens taken from the prefix
// cache) goes in prompt_tokens_details.
json usage_json(int32_t prompt_tokens, int32_t completion_tokens, int32_t cached_tokens);

// Non-stream body of a request that ended with Stop, Length or Cancelled.
// With ctx.output enabled the message carries g.parsed: `content` (null when
// there are calls and no text), `reasoning_content` and `tool_calls` (each
// only when non-empty).
json response_json(const ResponseContext& ctx, const Generation& g);

// Stream chunks. `first` marks the first chunk of a chat stream (it carries
// the assistant role). With `parsed` (ctx.output enabled) the delta carries
// its non-empty parts (`reasoning_content`, `content`, `tool_calls` as
// {index, id, type, function: {name, arguments}}) instead of e.text, and
// `content: ""` when it has none.
json token_chunk_json(const ResponseContext& ctx, const GenerationEvent& e, bool first,
                      size_t text_offset, const ChatOut* parsed = nullptr);
json final_chunk_json(const ResponseContext& ctx, FinishReason r, bool first,
                      bool tool_calls = false);
json usage_chunk_json(const ResponseContext& ctx, int32_t prompt_tokens, int32_t completion_tokens,
                      int32_t cached_tokens);

// "data: <json>\n\n"
std::string sse_event(const json& j);

}  // namespace tandem::server
