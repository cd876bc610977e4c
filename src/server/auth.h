// API-key authentication (--api-key).
//
// Contract: a request is authorized when no key is configured, or when it
// carries `Authorization: Bearer KEY` (scheme case-insensitive) or
// `x-api-key: KEY`. Keys are compared in constant time: the comparison takes
// the same time whatever the offered key's content and length (it depends on
// the configured key's length only). Open routes (/health, /metrics and CORS
// preflights) are decided by the server, not here.
#pragma once

#include <string>
#include <string_view>

namespace tandem::server {

// True when `offered` equals `expected`, in time independent of `offered`.
bool constant_time_equals(std::string_view expected, std::string_view offered);

// `authorization` and `x_api_key` are the header values ("" when absent).
bool api_key_authorized(const std::string& expected_key, const std::string& authorization,
                        const std::string& x_api_key);

}  // namespace tandem::server
