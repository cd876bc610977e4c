// Errors of the HTTP API, in the OpenAI shape:
//   {"error": {"message": "...", "type": "...", "code": "...", "param": "..."|null}}
//
// Every failure the server reports goes through ApiError, so the status code,
// the `type` and the `code` always agree (the table is in docs/api.md):
//   400 invalid_request_error  invalid_json, invalid_utf8, invalid_type,
//                              invalid_value, missing_required_parameter,
//                              unsupported_value, context_length_exceeded,
//                              no_tokenizer, no_chat_template
//   401 invalid_request_error  invalid_api_key
//   404 invalid_request_error  model_not_found, not_found, request_not_found
//   405 invalid_request_error  method_not_allowed
//   413 invalid_request_error  request_too_large
//   415 invalid_request_error  unsupported_media_type
//   500 server_error           internal_error
//   503 server_error           server_overloaded, model_loading,
//                              shutting_down, engine_unhealthy (+ Retry-After)
//   504 server_error           timeout
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tandem::server {

using json = nlohmann::json;

struct ApiError : std::runtime_error {
  ApiError(int status, std::string code, std::string param, const std::string& message)
      : std::runtime_error(message),
        status(status),
        code(std::move(code)),
        param(std::move(param)) {}
  int status;
  std::string code;   // machine-readable reason (see the table above)
  std::string param;  // the request field at fault, "" = none (null in JSON)

  // "invalid_request_error" for 4xx, "server_error" for 5xx.
  std::string type() const;
  // {"error": {...}}
  json body() const;
  // Seconds a client should wait before retrying (503 only), else 0.
  int retry_after_s() const { return status == 503 ? 1 : 0; }
};

// Shorthands for the common cases.
ApiError invalid_type(const std::string& param, const std::string& expected);
ApiError invalid_value(const std::string& param, const std::string& message);
ApiError missing_param(const std::string& param);
ApiError unsupported(const std::string& param, const std::string& message);
ApiError internal_error(const std::string& message);
ApiError unavailable(const std::string& code, const std::string& message);

// Serializes JSON for the wire. Never throws on invalid UTF-8 (replaces it):
// a reply must always be writable.
std::string dump_json(const json& j);

}  // namespace tandem::server
