// Other APIs over the chat pipeline: the Anthropic Messages API
// (server/anthropic_api.h) and the OpenAI Responses API
// (server/responses_api.h) translate their request into a chat-completions
// body and hand it to the same path as /v1/chat/completions (validation,
// prompt building with the model's template, images, engine submission,
// reasoning and tool-call parsing: server/generate.cpp). Only the wire
// shape of the answer differs: a ChatDialect writes it.
//
// Contract for a dialect: stream_open() comes once before anything else of
// a stream, then stream_delta() for each non-empty parsed piece, in order,
// then stream_close() exactly once (which ends the stream, with the
// dialect's error event when the request failed). Non-stream requests get
// one response() call. Failures before the first event are HTTP errors
// written by the route (ApiError).
#pragma once

#include <httplib.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/chat_output.h"
#include "server/errors.h"

namespace tandem::server {

struct ServerState;

// How a request ended, for the closing part of a response.
struct DialectFinish {
  FinishReason reason = FinishReason::None;
  std::optional<ApiError> error;  // reason Error / Timeout: what the client is told
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;                 // of prompt_tokens, taken from the prefix cache
  bool tool_calls = false;                   // the output made calls
  std::optional<std::string> stop_sequence;  // reason Stop by one of the request's stop strings
};

class ChatDialect {
 public:
  virtual ~ChatDialect() = default;
  // The response's id (also the id the cancel endpoint knows it by).
  virtual std::string id() const = 0;
  virtual json response(const ChatOut& out, const DialectFinish& f) = 0;
  virtual std::string stream_open(int32_t prompt_tokens) = 0;
  virtual std::string stream_delta(const ChatOut& d) = 0;
  virtual std::string stream_close(const DialectFinish& f) = 0;
};

// Runs a chat-completions body (already translated, client key order kept)
// through the chat path and answers with `dialect` (server/generate.cpp).
// Throws ApiError for anything answered before the response starts.
void handle_chat_dialect(ServerState& s, const nlohmann::ordered_json& chat_body,
                         std::shared_ptr<ChatDialect> dialect, const httplib::Request& req,
                         httplib::Response& res);

// The prompt's token count for a chat-completions body, built exactly as a
// generation would build it (template, tools, images), without running it.
int32_t chat_prompt_tokens(ServerState& s, const nlohmann::ordered_json& chat_body);

// "<prefix>" + 24 random letters and digits.
std::string random_api_id(const char* prefix);

// "event: NAME\ndata: JSON\n\n"
std::string sse_named_event(const std::string& name, const json& data);

// Request-reading helpers the dialects share (bodies read in key order).
namespace dialect {
using ojson = nlohmann::ordered_json;
// "base[i]", for error params.
inline std::string at(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}
// obj[name], or null when absent or JSON null.
inline const ojson* field(const ojson& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
// obj[name] as a string, or ApiError 400 naming where.name.
inline std::string need_string(const ojson& obj, const char* name, const std::string& where) {
  const ojson* v = field(obj, name);
  if (!v) throw missing_param(where + "." + name);
  if (!v->is_string()) throw invalid_type(where + "." + name, "a string");
  return v->get<std::string>();
}
}  // namespace dialect

}  // namespace tandem::server
