#include "server/auth.h"

#include <cctype>

namespace tandem::server {

bool constant_time_equals(std::string_view expected, std::string_view offered) {
  // Walk the expected key whatever the offered length; fold every difference
  // (content and length) into one accumulator, with no early exit.
  unsigned diff = expected.size() == offered.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char o = i < offered.size() ? static_cast<unsigned char>(offered[i]) : 0u;
    diff |= static_cast<unsigned char>(expected[i]) ^ o;
  }
  volatile unsigned sink = diff;  // keep the loop from being short-circuited
  return sink == 0;
}

namespace {

// "Bearer KEY" -> "KEY"; anything else -> "" (never matches a configured key,
// which is non-empty).
std::string_view bearer_token(std::string_view header) {
  constexpr std::string_view scheme = "bearer ";
  if (header.size() < scheme.size()) return {};
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != scheme[i]) return {};
  header.remove_prefix(scheme.size());
  while (!header.empty() && header.front() == ' ') header.remove_prefix(1);
  while (!header.empty() && header.back() == ' ') header.remove_suffix(1);
  return header;
}

}  // namespace

bool api_key_authorized(const std::string& expected_key, const std::string& authorization,
                        const std::string& x_api_key) {
  if (expected_key.empty()) return true;
  // Evaluate both candidates so the time does not tell which header matched.
  const bool by_bearer =
      !authorization.empty() && constant_time_equals(expected_key, bearer_token(authorization));
  const bool by_header = !x_api_key.empty() && constant_time_equals(expected_key, x_api_key);
  return by_bearer | by_header;
}

}  // namespace tandem::server
