// The OpenAI Responses API (POST /v1/responses), stateless, over the chat
// pipeline (server/chat_dialect.h): `input` (a string, or message /
// function_call / function_call_output items) and `instructions` become chat
// messages, `tools` ({type: function, name, parameters}) chat tools; the
// answer is a `response` object whose output holds a reasoning item, a
// message item (output_text) and function_call items, or the documented
// event stream (response.created … response.completed). Errors keep the
// OpenAI shape. `previous_response_id` is refused (nothing is stored);
// `store` is ignored. Fields: docs/api.md, "Responses".
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>

namespace tandem::server {

struct ServerState;

// A Responses request body -> a chat-completions body. Throws ApiError 400.
nlohmann::ordered_json responses_to_chat(const nlohmann::ordered_json& body);

void handle_responses(ServerState& s, const httplib::Request& req, httplib::Response& res);

}  // namespace tandem::server
