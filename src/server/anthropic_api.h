// The Anthropic Messages API over the chat pipeline (server/chat_dialect.h):
//   POST /v1/messages               a Messages request, answered as a message
//                                   or as Anthropic's event stream
//   POST /v1/messages/count_tokens  {"input_tokens": N} for the same body
// The request is translated to a chat-completions body (system -> a system
// message, tool_use blocks -> tool_calls, tool_result blocks -> tool
// messages, image blocks -> image_url parts, tools/tool_choice/thinking to
// their chat equivalents), so the prompt, the lanes and the output parsing
// are those of /v1/chat/completions. Errors have Anthropic's shape
// {"type": "error", "error": {"type", "message"}} with the statuses of the
// OpenAI routes. Fields and limits: docs/api.md, "Anthropic Messages".
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/errors.h"

namespace tandem::server {

struct ServerState;

// {"type": "error", "error": {"type": "invalid_request_error", "message": …}}:
// the type follows the status (401 authentication_error, 404
// not_found_error, 413 request_too_large, 503 overloaded_error, 5xx
// api_error, other 4xx invalid_request_error).
json anthropic_error_body(const ApiError& e);
const char* anthropic_error_type(int status);

// A Messages request body -> a chat-completions body. `count_only`:
// count_tokens (max_tokens is not required). Throws ApiError 400.
nlohmann::ordered_json anthropic_to_chat(const nlohmann::ordered_json& body, bool count_only);

void handle_anthropic_messages(ServerState& s, const httplib::Request& req, httplib::Response& res);
void handle_anthropic_count_tokens(ServerState& s, const httplib::Request& req,
                                   httplib::Response& res);

}  // namespace tandem::server
