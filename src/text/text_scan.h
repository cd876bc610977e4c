// Small scanning helpers shared by the output parsers (reasoning_parser.h,
// tool_call_parser.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace tandem::text {

inline bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// The first index at or after `from` that is not whitespace (size() if none).
inline size_t skip_space(std::string_view s, size_t from) {
  while (from < s.size() && is_space(s[from])) ++from;
  return from;
}

// The length of the longest suffix of `s` that is a proper prefix of
// `marker`: bytes that must wait, since the next text may complete the marker.
inline size_t partial_marker_suffix(std::string_view s, std::string_view marker) {
  const size_t most = std::min(s.size(), marker.empty() ? 0 : marker.size() - 1);
  for (size_t n = most; n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace tandem::text
