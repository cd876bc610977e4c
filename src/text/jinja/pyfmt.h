// Python's text forms of values: str(), repr(), float repr, json.dumps.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "text/jinja/value.h"

namespace tandem::jinja {

std::string py_float_repr(double d);
std::string py_string_repr(std::string_view s);
std::string py_str(const Value& v);   // str(x); Undefined prints as ""
std::string py_repr(const Value& v);  // repr(x)

// Python's `fmt % args` (printf-style): positional args, or %(name)s keys
// from the keyword arguments.
std::string percent_format(const std::string& fmt, const CallArgs& args);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;             // None, or the indent unit
  std::optional<std::string> item_sep, key_sep;  // json.dumps separators
  bool sort_keys = false;
};
// json.dumps(x, ...) exactly as Python formats it. Throws tandem::Error for
// values JSON cannot hold (Undefined, callables, ...).
std::string json_dumps(const Value& v, const JsonOptions& o);

}  // namespace tandem::jinja
