#include "text/jinja/lexer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/jinja/error.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  Lexer(std::string src, const LexOptions& o) : src_(std::move(src)), o_(o) {
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') newlines_.push_back(k);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) pos = lex_root(pos);
    Token eof;
    eof.type = Tok::Eof;
    eof.line = line_at(src_.size());
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  std::string src_;
  LexOptions o_;
  std::vector<size_t> newlines_;
  std::vector<Token> out_;
  bool line_starting_ = true;

  int line_at(size_t offset) const {
    return int(std::lower_bound(newlines_.begin(), newlines_.end(), offset) - newlines_.begin()) +
           1;
  }

  [[noreturn]] void error(const std::string& msg, size_t offset) const {
    throw TemplateError(msg, line_at(offset));
  }

  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Length of the run of (Unicode) whitespace starting at p.
  size_t ws_len(size_t p) const {
    size_t q = p;
    while (q < src_.size()) {
      size_t r = q;
      uint32_t c = str::decode(src_, r);
      if (!str::is_space(c)) break;
      q = r;
    }
    return q - p;
  }

  static bool all_space(std::string_view s) {
    if (s.empty()) return false;
    for (size_t i = 0; i < s.size();)
      if (!str::is_space(str::decode(s, i))) return false;
    return true;
  }

  static std::string rstrip_ws(std::string_view s) {
    std::vector<uint32_t> cps = str::to_cps(s);
    size_t e = cps.size();
    while (e > 0 && str::is_space(cps[e - 1])) --e;
    return str::from_cps(cps.data(), e);
  }

  void emit_data(std::string text, char sign, bool is_variable, size_t offset) {
    if (sign == '-') {
      text = rstrip_ws(text);
    } else if (sign != '+' && o_.lstrip_blocks && !is_variable) {
      size_t l_pos = text.rfind('\n');
      l_pos = (l_pos == std::string::npos) ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
    if (!text.empty()) {
      Token t;
      t.type = Tok::Data;
      t.text = std::move(text);
      t.line = line_at(offset);
      out_.push_back(std::move(t));
    }
  }

  void push(Tok type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_at(offset);
    out_.push_back(std::move(t));
  }

  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at p; returns end or npos.
  size_t match_raw_begin(size_t p) const {
    size_t q = p + 2;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
    q += ws_len(q);
    if (!at(q, "raw")) return std::string::npos;
    q += 3;
    q += ws_len(q);
    if (at(q, "-%}")) return q + 3 + ws_len(q + 3);
    if (at(q, "%}")) return q + 2;
    return std::string::npos;
  }

  size_t lex_root(size_t pos) {
    size_t p = pos;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) {
        emit_data(src_.substr(pos), 0, true, pos);
        return src_.size();
      }
      char k = src_[p + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++p;
    }
    const char kind = src_[p + 1];
    char sign = 0;
    if (p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+')) sign = src_[p + 2];
    std::string text = src_.substr(pos, p - pos);

    if (kind == '%') {
      size_t raw_end = match_raw_begin(p);
      if (raw_end != std::string::npos) {
        emit_data(std::move(text), sign, false, pos);
        line_starting_ = src_[raw_end - 1] == '\n';
        return lex_raw(raw_end);
      }
    }
    emit_data(std::move(text), sign, kind == '{', pos);
    line_starting_ = false;
    size_t q = p + 2 + (sign ? 1 : 0);
    if (kind == '#') return lex_comment(q, p);
    push(kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", p);
    return lex_tag(q, kind == '%');
  }

  size_t end_of_block_end(size_t q) const {
    // q points just past "%}" of a plain end; trim_blocks eats one newline.
    if (o_.trim_blocks && q < src_.size() && src_[q] == '\n') return q + 1;
    return q;
  }

  size_t lex_comment(size_t q, size_t start) {
    for (; q < src_.size(); ++q) {
      if (at(q, "+#}")) return finish(q + 3);
      if (at(q, "-#}")) return finish(q + 3 + ws_len(q + 3));
      if (at(q, "#}")) return finish(end_of_block_end(q + 2));
    }
    error("Missing end of comment tag", start);
  }

  size_t finish(size_t end) {
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    return end;
  }

  size_t lex_raw(size_t pos) {
    for (size_t q = src_.find("{%", pos); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r += ws_len(r);
      if (!at(r, "endraw")) continue;
      r += 6;
      r += ws_len(r);
      size_t end;
      if (at(r, "+%}"))
        end = r + 3;
      else if (at(r, "-%}"))
        end = r + 3 + ws_len(r + 3);
      else if (at(r, "%}"))
        end = end_of_block_end(r + 2);
      else
        continue;
      emit_data(src_.substr(pos, q - pos), sign, false, pos);
      return finish(end);
    }
    error("Missing end of raw directive", pos);
  }

  size_t lex_tag(size_t q, bool block) {
    std::vector<char> balance;
    const size_t start = q;
    while (true) {
      if (q >= src_.size())
        error(block ? "Unexpected end of template, expected '%}'"
                    : "Unexpected end of template, expected '}}'",
              start);
      if (balance.empty()) {
        if (block) {
          if (at(q, "+%}")) return close(Tok::BlockEnd, q, q + 3);
          if (at(q, "-%}")) return close(Tok::BlockEnd, q, q + 3 + ws_len(q + 3));
          if (at(q, "%}")) return close(Tok::BlockEnd, q, end_of_block_end(q + 2));
        } else {
          if (at(q, "-}}")) return close(Tok::VarEnd, q, q + 3 + ws_len(q + 3));
          if (at(q, "}}")) return close(Tok::VarEnd, q, q + 2);
        }
      }
      if (size_t w = ws_len(q)) {
        q += w;
        continue;
      }
      const char c = src_[q];
      if (is_digit(c)) {
        q = lex_number(q);
        continue;
      }
      if (is_name_start(c)) {
        size_t e = q;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        push(Tok::Name, src_.substr(q, e - q), q);
        q = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = q + 1;
        while (e < src_.size() && src_[e] != c) e += (src_[e] == '\\') ? 2 : 1;
        if (e < src_.size()) {
          Token t;
          t.type = Tok::String;
          t.text = unescape(src_.substr(q + 1, e - q - 1), q);
          t.line = line_at(q);
          out_.push_back(std::move(t));
          q = e + 1;
          continue;
        }
      }
      static const char* const two[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* t : two)
        if (at(q, t)) op = t;
      if (op.empty() && std::string_view("+-/*%~[](){}<>=.:|,;").find(c) != std::string_view::npos)
        op = std::string(1, c);
      if (op.empty()) {
        error("unexpected char '" + std::string(1, c) + "' at " + std::to_string(q), q);
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
      } else if (op == ")" || op == "]" || op == "}") {
        if (balance.empty()) error("unexpected '" + op + "'", q);
        if (balance.back() != op[0])
          error("unexpected '" + op + "', expected '" + std::string(1, balance.back()) + "'", q);
        balance.pop_back();
      }
      push(Tok::Op, op, q);
      q += op.size();
    }
  }

  size_t close(Tok type, size_t q, size_t end) {
    push(type, "", q);
    return finish(end);
  }

  size_t digits_run(size_t q) const {
    // (\d+_)*\d+
    size_t e = q;
    if (e >= src_.size() || !is_digit(src_[e])) return q;
    while (true) {
      while (e < src_.size() && is_digit(src_[e])) ++e;
      if (e + 1 < src_.size() && src_[e] == '_' && is_digit(src_[e + 1])) {
        ++e;
        continue;
      }
      return e;
    }
  }

  size_t lex_number(size_t q) {
    // Float first (like Jinja's rule order), then integer.
    const bool after_dot = q > 0 && src_[q - 1] == '.';
    size_t ip = digits_run(q);
    if (!after_dot) {
      size_t e = ip;
      bool is_float = false;
      if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = digits_run(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        size_t xe = digits_run(x);
        if (xe > x) {
          e = xe;
          is_float = true;
        }
      }
      if (is_float) {
        std::string text;
        for (size_t k = q; k < e; ++k)
          if (src_[k] != '_') text.push_back(src_[k]);
        Token t;
        t.type = Tok::Float;
        t.fval = std::strtod(text.c_str(), nullptr);
        t.text = text;
        t.line = line_at(q);
        out_.push_back(std::move(t));
        return e;
      }
    }
    // Integers: 0b / 0o / 0x prefixes, decimal, or zeros.
    int base = 10;
    size_t e = q;
    std::string digits;
    if (src_[q] == '0' && q + 1 < src_.size() &&
        std::string_view("bBoOxX").find(src_[q + 1]) != std::string_view::npos) {
      const char p = char(src_[q + 1] | 0x20);
      base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
      auto ok = [&](char c) {
        if (base == 2) return c == '0' || c == '1';
        if (base == 8) return c >= '0' && c <= '7';
        return is_digit(c) || (char(c | 0x20) >= 'a' && char(c | 0x20) <= 'f');
      };
      e = q + 2;
      while (e < src_.size()) {
        if (src_[e] == '_' && e + 1 < src_.size() && ok(src_[e + 1])) {
          ++e;
          continue;
        }
        if (!ok(src_[e])) break;
        digits.push_back(src_[e++]);
      }
      if (digits.empty()) {
        base = 10;
        e = q + 1;
        digits = "0";
      }
    } else if (src_[q] == '0') {
      e = q + 1;
      while (e < src_.size()) {
        if (src_[e] == '0')
          ++e;
        else if (src_[e] == '_' && e + 1 < src_.size() && src_[e + 1] == '0')
          e += 2;
        else
          break;
      }
      digits = "0";
    } else {
      e = ip;
      for (size_t k = q; k < e; ++k)
        if (src_[k] != '_') digits.push_back(src_[k]);
    }
    errno = 0;
    Token t;
    t.type = Tok::Int;
    t.text = digits;
    t.line = line_at(q);
    char* endp = nullptr;
    unsigned long long v = std::strtoull(digits.c_str(), &endp, base);
    if (errno == ERANGE || v > uint64_t(INT64_MAX)) {
      t.type = Tok::Float;  // beyond int64: keep the magnitude
      t.fval = std::strtod(digits.c_str(), nullptr);
    } else {
      t.ival = int64_t(v);
    }
    out_.push_back(std::move(t));
    return e;
  }

  // Python's "unicode-escape" decoding of a string literal's body.
  std::string unescape(const std::string& s, size_t offset) const {
    std::string out;
    out.reserve(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      char c = s[k];
      if (c != '\\' || k + 1 >= s.size()) {
        out.push_back(c);
        continue;
      }
      char n = s[++k];
      switch (n) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t d = 0; d < len; ++d) {
            if (k + 1 + d >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[k + 1 + d])))
              error(std::string("truncated \\") + n + " escape", offset);
            cp =
                cp * 16 + uint32_t(std::strtoul(std::string(1, s[k + 1 + d]).c_str(), nullptr, 16));
          }
          if (cp > 0x10FFFF) error("illegal Unicode character", offset);
          str::append_utf8(out, cp);
          k += len;
          break;
        }
        default:
          if (n >= '0' && n <= '7') {
            uint32_t cp = uint32_t(n - '0');
            for (int d = 0; d < 2 && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '7'; ++d)
              cp = cp * 8 + uint32_t(s[++k] - '0');
            str::append_utf8(out, cp);
          } else if (n == 'N') {
            error("\\N{...} escapes are not supported", offset);
          } else {
            out.push_back('\\');
            out.push_back(n);
          }
      }
    }
    return out;
  }
};

std::string normalize_source(std::string_view source, bool keep_trailing_newline) {
  std::string s;
  s.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      s.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      s.push_back(source[k]);
    }
  }
  if (!keep_trailing_newline && !s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& opts) {
  Lexer lx(normalize_source(source, opts.keep_trailing_newline), opts);
  return lx.run();
}

}  // namespace tandem::jinja
