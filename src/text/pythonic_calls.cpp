#include "text/pythonic_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>

#include "text/text_scan.h"
#include "text/tool_call_parser.h"

namespace tandem::text {

namespace {

using ojson = nlohmann::ordered_json;
constexpr int kMaxDepth = 64;

class PyReader {
 public:
  explicit PyReader(std::string_view s) : s_(s) {}

  bool calls(std::vector<ToolCall>& out) {
    if (!eat('[')) return false;
    do {
      ToolCall c;
      if (!call(c)) return false;
      out.push_back(std::move(c));
    } while (eat(','));
    return eat(']') && at_end();
  }

 private:
  void space() { i_ = skip_space(s_, i_); }
  bool eat(char c) {
    space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool at_end() {
    space();
    return i_ == s_.size();
  }
  bool peek(char c) {
    space();
    return i_ < s_.size() && s_[i_] == c;
  }

  std::string ident() {
    space();
    const size_t from = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' ||
                              s_[i_] == '.' || s_[i_] == '-'))
      ++i_;
    return std::string(s_.substr(from, i_ - from));
  }

  bool call(ToolCall& c) {
    c.name = ident();
    if (c.name.empty() || !eat('(')) return false;
    ojson args = ojson::object();
    if (!eat(')')) {
      do {
        const std::string key = ident();
        if (key.empty() || !eat('=')) return false;
        ojson v;
        if (!value(v, 0)) return false;
        args[key] = std::move(v);
      } while (eat(','));
      if (!eat(')')) return false;
    }
    c.arguments = args.dump(-1, ' ', false, ojson::error_handler_t::replace);
    return true;
  }

  bool value(ojson& out, int depth) {
    if (depth > kMaxDepth) return false;
    space();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '"' || c == '\'') return string(out);
    if (c == '[' || c == '(') return list(out, depth, c == '[' ? ']' : ')');
    if (c == '{') return dict(out, depth);
    size_t k = i_;
    while (k < s_.size() && !is_space(s_[k]) && s_[k] != ',' && s_[k] != ')' && s_[k] != ']' &&
           s_[k] != '}' && s_[k] != ':')
      ++k;
    const std::string_view word = s_.substr(i_, k - i_);
    if (!parse_bare_scalar(word, out)) return false;
    i_ = k;
    return true;
  }

  // A Python string literal (' or "), with the common escapes.
  bool string(ojson& out) {
    const char q = s_[i_++];
    std::string v;
    while (i_ < s_.size() && s_[i_] != q) {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) return false;
        const char e = s_[i_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case '\\':
          case '\'':
          case '"': c = e; break;
          default: v += '\\'; c = e;
        }
      }
      v += c;
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    out = std::move(v);
    return true;
  }

  bool list(ojson& out, int depth, char close) {
    ++i_;
    out = ojson::array();
    if (eat(close)) return true;
    do {
      ojson v;
      if (!value(v, depth + 1)) return false;
      out.push_back(std::move(v));
    } while (eat(','));
    return eat(close);
  }

  bool dict(ojson& out, int depth) {
    ++i_;
    out = ojson::object();
    if (eat('}')) return true;
    do {
      ojson k, v;
      space();
      if (i_ >= s_.size() || (s_[i_] != '"' && s_[i_] != '\'') || !string(k)) return false;
      if (!eat(':') || !value(v, depth + 1)) return false;
      out[k.get<std::string>()] = std::move(v);
    } while (eat(','));
    return eat('}');
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

size_t pythonic_extent(std::string_view s, size_t start) {
  int depth = 0;
  char quote = 0;
  bool escaped = false;
  for (size_t k = start; k < s.size(); ++k) {
    const char c = s[k];
    if (quote) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == ')' || c == '}') && --depth == 0) {
      return k + 1;
    }
  }
  return std::string_view::npos;
}

std::optional<std::vector<ToolCall>> parse_pythonic_calls(std::string_view list) {
  std::vector<ToolCall> calls;
  PyReader r(list);
  if (!r.calls(calls) || calls.empty()) return std::nullopt;
  for (const ToolCall& c : calls)
    if (c.name.empty() ||
        (!std::isalpha(static_cast<unsigned char>(c.name[0])) && c.name[0] != '_'))
      return std::nullopt;
  return calls;
}

}  // namespace tandem::text
