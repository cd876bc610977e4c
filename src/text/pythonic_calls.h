// Llama 3.2's "pythonic" tool calls: the answer is a Python list of calls,
// [get_weather(city="Paris", days=2), get_time()], with keyword arguments
// whose values are Python literals (strings in ' or ", numbers,
// True/False/None, lists, dicts), read as JSON.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "text/tool_call_parser.h"

namespace tandem::text {

// One past the ']' closing the list opening at s[start] == '[' (brackets in
// strings skipped); npos while open.
size_t pythonic_extent(std::string_view s, size_t start);

// The calls of a whole list "[f(a=1), g()]"; nullopt when it is not one (an
// empty list, positional arguments, anything but literals).
std::optional<std::vector<ToolCall>> parse_pythonic_calls(std::string_view list);

}  // namespace tandem::text
