#include "text/tool_call_stream.h"

#include <nlohmann/json.hpp>

#include "text/text_scan.h"

namespace tandem::text {

namespace {

// One past the JSON string starting at s[i] == '"'; npos while open.
size_t string_end(std::string_view s, size_t i) {
  bool escaped = false;
  for (size_t k = i + 1; k < s.size(); ++k) {
    if (escaped)
      escaped = false;
    else if (s[k] == '\\')
      escaped = true;
    else if (s[k] == '"')
      return k + 1;
  }
  return std::string_view::npos;
}

// Reads `"key"` then ':' from i; the key's text, or NeedMore/NotStreamable.
CallHead::State read_key(std::string_view s, size_t& i, std::string& key) {
  i = skip_space(s, i);
  if (i == s.size()) return CallHead::NeedMore;
  if (s[i] != '"') return CallHead::NotStreamable;
  const size_t e = string_end(s, i);
  if (e == std::string_view::npos) return CallHead::NeedMore;
  nlohmann::json k = nlohmann::json::parse(s.substr(i, e - i), nullptr, false);
  if (!k.is_string()) return CallHead::NotStreamable;
  key = k.get<std::string>();
  i = skip_space(s, e);
  if (i == s.size()) return CallHead::NeedMore;
  if (s[i] != ':') return CallHead::NotStreamable;
  i = skip_space(s, i + 1);
  return i == s.size() ? CallHead::NeedMore : CallHead::Found;
}

}  // namespace

CallHead json_call_head(std::string_view s, size_t open) {
  CallHead h;
  size_t i = open + 1;
  std::string key;
  if ((h.state = read_key(s, i, key)) != CallHead::Found) return h;
  if (key != "name" || s[i] != '"') return {CallHead::NotStreamable, "", 0};
  const size_t e = string_end(s, i);
  if (e == std::string_view::npos) return {CallHead::NeedMore, "", 0};
  nlohmann::json name = nlohmann::json::parse(s.substr(i, e - i), nullptr, false);
  if (!name.is_string()) return {CallHead::NotStreamable, "", 0};
  i = skip_space(s, e);
  if (i == s.size()) return {CallHead::NeedMore, "", 0};
  if (s[i] != ',') return {CallHead::NotStreamable, "", 0};
  if ((h.state = read_key(s, ++i, key)) != CallHead::Found) return h;
  if ((key != "arguments" && key != "parameters") || s[i] != '{')
    return {CallHead::NotStreamable, "", 0};
  return {CallHead::Found, name.get<std::string>(), i};
}

CallHead mistral_call_head(std::string_view s, size_t from, size_t next_marker) {
  const std::string_view upto = s.substr(0, std::min(s.size(), next_marker));
  const size_t args = upto.find("[ARGS]", from);
  if (args == std::string_view::npos)
    return {next_marker == std::string_view::npos ? CallHead::NeedMore : CallHead::NotStreamable,
            "", 0};
  std::string_view name = upto.substr(from, args - from);
  if (const size_t id = name.find("[CALL_ID]"); id != std::string_view::npos)
    name = name.substr(0, id);
  while (!name.empty() && is_space(name.front())) name.remove_prefix(1);
  while (!name.empty() && is_space(name.back())) name.remove_suffix(1);
  const size_t j = skip_space(upto, args + 6);
  if (j == upto.size())
    return {next_marker == std::string_view::npos ? CallHead::NeedMore : CallHead::NotStreamable,
            "", 0};
  if (upto[j] != '{' || name.empty()) return {CallHead::NotStreamable, "", 0};
  return {CallHead::Found, std::string(name), j};
}

std::string JsonMinifier::push(std::string_view s, size_t& used) {
  std::string out;
  size_t k = 0;
  for (; k < s.size() && !closed_; ++k) {
    const char c = s[k];
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      out += c;
      continue;
    }
    if (is_space(c)) continue;
    out += c;
    if (c == '"') {
      in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++depth_;
    } else if ((c == '}' || c == ']') && --depth_ == 0) {
      closed_ = true;
    }
  }
  used = k;
  return out;
}

std::string minify_json(std::string_view s) {
  JsonMinifier m;
  size_t used = 0;
  return m.push(s, used);
}

}  // namespace tandem::text
