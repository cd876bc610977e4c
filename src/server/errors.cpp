#include "server/errors.h"

namespace tandem::server {

std::string ApiError::type() const {
  return status >= 500 ? "server_error" : "invalid_request_error";
}

json ApiError::body() const {
  json e = {{"message", what()}, {"type", type()}, {"code", code}, {"param", nullptr}};
  if (!param.empty()) e["param"] = param;
  return json{{"error", std::move(e)}};
}

ApiError invalid_type(const std::string& param, const std::string& expected) {
  return ApiError(400, "invalid_type", param, "'" + param + "' must be " + expected);
}

ApiError invalid_value(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_value", param, message);
}

ApiError missing_param(const std::string& param) {
  return ApiError(400, "missing_required_parameter", param,
                  "missing required parameter '" + param + "'");
}

ApiError unsupported(const std::string& param, const std::string& message) {
  return ApiError(400, "unsupported_value", param, message);
}

ApiError internal_error(const std::string& message) {
  return ApiError(500, "internal_error", "", message);
}

ApiError unavailable(const std::string& code, const std::string& message) {
  return ApiError(503, code, "", message);
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace tandem::server
