// Environment variables with defaults.
#pragma once

#include <cstdlib>
#include <string>

namespace tandem {

// The variable's value, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

}  // namespace tandem
