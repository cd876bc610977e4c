#include "text/tool_call_parser.h"

#include <algorithm>

#include "text/pythonic_calls.h"
#include "text/text_scan.h"

namespace tandem::text {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kGemmaQuote = "<|\"|>";
constexpr int kMaxDepth = 64;
constexpr size_t kMaxNameBytes = 256;

std::string_view trim(std::string_view s) {
  s.remove_prefix(skip_space(s, 0));
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A function name as models write them: "get_weather", "tools.shell-exec",
// "mcp__server__tool". No spaces, quotes or brackets.
bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name)
    if (is_space(c) || std::string_view("\"'<>{}[](),;|\\").find(c) != std::string_view::npos)
      return false;
  return true;
}

std::string compact(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

}  // namespace

// One past the bracket that closes the JSON object or array opening at
// s[start] ('{' or '['), skipping brackets inside strings; npos while open.
// Resumes where the last call for the same start stopped, so a long call
// arriving token by token is scanned once.
size_t ToolCallParser::json_extent(std::string_view s, size_t start) {
  JsonScan& j = scan_;
  if (j.start != start || j.pos > s.size()) j = JsonScan{start, start};
  for (; j.pos < s.size(); ++j.pos) {
    const char c = s[j.pos];
    if (j.in_string) {
      if (j.escaped)
        j.escaped = false;
      else if (c == '\\')
        j.escaped = true;
      else if (c == '"')
        j.in_string = false;
      continue;
    }
    if (c == '"') {
      j.in_string = true;
    } else if (c == '{' || c == '[') {
      ++j.depth;
    } else if (c == '}' || c == ']') {
      if (--j.depth == 0) return j.pos + 1;
    }
  }
  return std::string_view::npos;
}

namespace {

std::optional<ToolCall> call_from_json_text(std::string_view text) {
  ojson j = ojson::parse(trim(text), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return tool_call_from_json(j);
}

// Gemma 4's value syntax (the template's format_argument, keys unescaped).
class GemmaReader {
 public:
  explicit GemmaReader(std::string_view s) : s_(s) {}

  bool value(ojson& out, int depth) {
    if (depth > kMaxDepth) return false;
    space();
    if (i_ >= s_.size()) return false;
    if (s_.substr(i_).starts_with(kGemmaQuote)) return gemma_string(out);
    const char c = s_[i_];
    if (c == '"') return json_string(out);
    if (c == '{') return object(out, depth);
    if (c == '[') return array(out, depth);
    return scalar(out);
  }
  bool at_end() {
    space();
    return i_ == s_.size();
  }

 private:
  void space() { i_ = skip_space(s_, i_); }

  bool gemma_string(ojson& out) {
    const size_t from = i_ + kGemmaQuote.size();
    const size_t to = s_.find(kGemmaQuote, from);
    if (to == std::string_view::npos) return false;
    out = std::string(s_.substr(from, to - from));
    i_ = to + kGemmaQuote.size();
    return true;
  }

  bool json_string(ojson& out) {
    bool escaped = false;
    for (size_t k = i_ + 1; k < s_.size(); ++k) {
      if (escaped) {
        escaped = false;
      } else if (s_[k] == '\\') {
        escaped = true;
      } else if (s_[k] == '"') {
        ojson j = ojson::parse(s_.substr(i_, k + 1 - i_), nullptr, false);
        if (j.is_discarded()) return false;
        out = std::move(j);
        i_ = k + 1;
        return true;
      }
    }
    return false;
  }

  bool key(std::string& out) {
    space();
    if (i_ >= s_.size()) return false;
    if (s_.substr(i_).starts_with(kGemmaQuote) || s_[i_] == '"') {
      ojson k;
      if (!(s_[i_] == '"' ? json_string(k) : gemma_string(k))) return false;
      out = k.get<std::string>();
      return true;
    }
    const size_t colon = s_.find(':', i_);
    if (colon == std::string_view::npos) return false;
    const std::string_view bare = trim(s_.substr(i_, colon - i_));
    if (bare.empty() || bare.find_first_of("{}[],<>\"") != std::string_view::npos) return false;
    out = std::string(bare);
    i_ = colon;
    return true;
  }

  bool object(ojson& out, int depth) {
    out = ojson::object();
    ++i_;  // '{'
    space();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      std::string k;
      if (!key(k)) return false;
      space();
      if (i_ >= s_.size() || s_[i_] != ':') return false;
      ++i_;
      ojson v;
      if (!value(v, depth + 1)) return false;
      out[k] = std::move(v);
      space();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] != '}') return false;
      ++i_;
      return true;
    }
  }

  bool array(ojson& out, int depth) {
    out = ojson::array();
    ++i_;  // '['
    space();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      ojson v;
      if (!value(v, depth + 1)) return false;
      out.push_back(std::move(v));
      space();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] != ']') return false;
      ++i_;
      return true;
    }
  }

  // true/false, null/None (Python's rendering of None), numbers; a bare
  // word is not a value (strings are always quoted).
  bool scalar(ojson& out) {
    size_t k = i_;
    while (k < s_.size() && !is_space(s_[k]) && s_[k] != ',' && s_[k] != '}' && s_[k] != ']') ++k;
    const std::string_view word = s_.substr(i_, k - i_);
    if (!parse_bare_scalar(word, out)) return false;
    i_ = k;
    return true;
  }

  std::string_view s_;
  size_t i_ = 0;
};

// "call:NAME{...}" between Gemma 4's markers.
std::optional<ToolCall> gemma_call(std::string_view body) {
  body = trim(body);
  if (!body.starts_with("call:")) return std::nullopt;
  body.remove_prefix(5);
  const size_t brace = body.find('{');
  if (brace == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(body.substr(0, brace));
  if (!valid_name(name)) return std::nullopt;
  std::optional<ojson> args = parse_gemma4_value(body.substr(brace));
  if (!args || !args->is_object()) return std::nullopt;
  return ToolCall{std::string(name), compact(*args)};
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3-json";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::Gemma4: return "gemma4";
    case ToolCallFormat::Pythonic: return "pythonic";
  }
  return "none";
}

std::optional<ojson> parse_gemma4_value(std::string_view text) {
  GemmaReader r(text);
  ojson out;
  if (!r.value(out, 0) || !r.at_end()) return std::nullopt;
  return out;
}

std::optional<ToolCall> tool_call_from_json(const ojson& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || !valid_name(name->get<std::string>()))
    return std::nullopt;
  ojson args = ojson::object();
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  if (a != j.end() && !a->is_null()) {
    if (a->is_string()) {
      const std::string& s = a->get_ref<const std::string&>();
      if (!trim(s).empty()) args = ojson::parse(s, nullptr, false);
    } else {
      args = *a;
    }
    if (!args.is_object()) return std::nullopt;
  }
  return ToolCall{name->get<std::string>(), compact(args)};
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool stream_arguments)
    : stream_args_(stream_arguments), format_(format) {
  switch (format) {
    case ToolCallFormat::None: break;
    case ToolCallFormat::Hermes: marker_ = "<tool_call>"; break;
    case ToolCallFormat::Llama3Json: marker_ = "<|python_tag|>"; break;
    case ToolCallFormat::Mistral: marker_ = "[TOOL_CALLS]"; break;
    case ToolCallFormat::Gemma4: marker_ = "<|tool_call>"; break;
    case ToolCallFormat::Pythonic: break;  // a list at the start of the answer
  }
}

ToolCallDelta ToolCallParser::push(std::string_view text) {
  ToolCallDelta out;
  buf_.append(text);
  run(out, false);
  return out;
}

ToolCallDelta ToolCallParser::flush() {
  ToolCallDelta out;
  run(out, true);
  // Trailing whitespace is the model's only when there was no call.
  if (calls_ == 0) out.content += held_space_;
  held_space_.clear();
  return out;
}

void ToolCallParser::run(ToolCallDelta& out, bool at_end) {
  while (in_call_ ? scan_call(out, at_end) : scan_text(out, at_end)) {
  }
}

void ToolCallParser::emit(std::string_view s, ToolCallDelta& out) {
  if (drop_space_) {
    s.remove_prefix(skip_space(s, 0));
    if (s.empty()) return;
    drop_space_ = false;
  }
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  if (end > 0) {
    out.content += held_space_;
    held_space_.clear();
    out.content.append(s.substr(0, end));
  }
  held_space_.append(s.substr(end));
}

// Content up to the next possible call; true when a call opens.
bool ToolCallParser::scan_text(ToolCallDelta& out, bool at_end) {
  if (format_ == ToolCallFormat::None) {
    emit(buf_, out);
    buf_.clear();
    return false;
  }
  size_t open = std::string::npos;
  if (format_ == ToolCallFormat::Pythonic && at_start_) {
    const size_t i = skip_space(buf_, 0);
    if (i == buf_.size() && !at_end) return false;
    if (i < buf_.size() && buf_[i] == '[') open = i;
    at_start_ = false;
  }
  if (format_ == ToolCallFormat::Llama3Json && at_start_) {
    // A bare JSON call only at the start of the output (or after a call,
    // with ";" between calls).
    size_t i = 0;
    while (i < buf_.size() && (is_space(buf_[i]) || (calls_ > 0 && buf_[i] == ';'))) ++i;
    if (i == buf_.size()) {
      if (at_end) {
        emit(buf_, out);
        buf_.clear();
      }
      return false;
    }
    if (buf_[i] == '{') {
      open = i;
      if (calls_ > 0) {  // the "; " between calls is dropped
        buf_.erase(0, i);
        open = 0;
      }
    }
    at_start_ = false;
  }
  if (open == std::string::npos && !marker_.empty()) open = buf_.find(marker_);
  if (open == std::string::npos) {
    const size_t keep = at_end ? 0 : partial_marker_suffix(buf_, marker_);
    emit(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    return false;
  }
  emit(std::string_view(buf_).substr(0, open), out);
  buf_.erase(0, open);
  in_call_ = true;
  searched_ = 0;
  scan_ = JsonScan{};
  st_ = Streamed{};
  return true;
}

// Finds the open call's head, then minifies its arguments as they come;
// with stream_args_, gives out the call's first piece and the arguments.
void ToolCallParser::stream_call(ToolCallDelta& out) {
  const std::string_view b = buf_;
  if (st_.head.state == CallHead::NeedMore) {
    if (format_ == ToolCallFormat::Mistral) {
      const size_t i = skip_space(b, marker_.size());
      if (i < b.size() && b[i] == '[') {
        st_.head.state = CallHead::NotStreamable;  // the JSON array form
      } else {
        const size_t next = b.find(marker_, marker_.size());
        st_.head = mistral_call_head(b, marker_.size(), next);
      }
    } else if (format_ == ToolCallFormat::Hermes || format_ == ToolCallFormat::Llama3Json) {
      const size_t from = b.starts_with(marker_) ? marker_.size() : 0;
      const size_t open = skip_space(b, from);
      if (open == b.size()) return;
      if (b[open] != '{')
        st_.head.state = CallHead::NotStreamable;
      else
        st_.head = json_call_head(b, open);
    } else {
      st_.head.state = CallHead::NotStreamable;
    }
    if (st_.head.state != CallHead::Found) return;
    st_.pos = st_.head.args;
  }
  if (st_.head.state != CallHead::Found || st_.minifier.closed()) return;
  size_t used = 0;
  const std::string more = st_.minifier.push(b.substr(st_.pos), used);
  st_.pos += used;
  st_.args += more;
  if (!stream_args_ || (st_.committed && more.empty())) return;
  out.pieces.push_back({calls_, st_.committed ? "" : st_.head.name, more, !st_.committed});
  st_.committed = true;
}

void ToolCallParser::completed(std::vector<ToolCall> calls, size_t raw_end, ToolCallDelta& out) {
  buf_.erase(0, raw_end);
  in_call_ = false;
  held_space_.clear();  // whitespace before a call is dropped
  drop_space_ = true;   // and after it
  if (calls.size() == 1 && st_.head.state == CallHead::Found && st_.minifier.closed() &&
      (st_.committed ||
       ojson::parse(st_.args, nullptr, false) == ojson::parse(calls[0].arguments, nullptr, false)))
    calls[0].arguments = st_.args;  // the model's own text (what was streamed)
  for (ToolCall& c : calls) {
    if (stream_args_ && !st_.committed)
      out.pieces.push_back({calls_ + int(out.calls.size()), c.name, c.arguments, true});
    out.calls.push_back(std::move(c));
  }
  calls_ += int(calls.size());
  st_ = Streamed{};
  if (format_ == ToolCallFormat::Llama3Json) at_start_ = true;  // "; {" may follow
}

void ToolCallParser::malformed(size_t raw_end, ToolCallDelta& out) {
  const std::string raw = buf_.substr(0, raw_end);
  buf_.erase(0, raw_end);
  in_call_ = false;
  if (st_.committed) {
    // Its first piece is out: it stays a call, and its text is not content.
    ++calls_;
    st_ = Streamed{};
    held_space_.clear();
    drop_space_ = true;
    if (format_ == ToolCallFormat::Llama3Json) at_start_ = true;
    return;
  }
  emit(raw, out);
  if (format_ == ToolCallFormat::Llama3Json) at_start_ = false;
}

// The opened call at the start of buf_: true when it was decided (a call or
// content), false while it needs more text.
bool ToolCallParser::scan_call(ToolCallDelta& out, bool at_end) {
  stream_call(out);
  const std::string_view b = buf_;
  switch (format_) {
    case ToolCallFormat::None: break;
    case ToolCallFormat::Hermes:
    case ToolCallFormat::Gemma4: {
      const std::string_view close =
          format_ == ToolCallFormat::Hermes ? "</tool_call>" : "<tool_call|>";
      const size_t c = b.find(close, std::max(marker_.size(), searched_));
      searched_ = b.size() - std::min(b.size(), close.size() - 1);
      if (c == std::string_view::npos) {
        if (at_end) malformed(buf_.size(), out);
        return at_end;
      }
      const std::string_view body = b.substr(marker_.size(), c - marker_.size());
      std::optional<ToolCall> call =
          format_ == ToolCallFormat::Hermes ? call_from_json_text(body) : gemma_call(body);
      if (call)
        completed({std::move(*call)}, c + close.size(), out);
      else
        malformed(c + close.size(), out);
      return true;
    }
    case ToolCallFormat::Llama3Json: {
      // "{...}" (bare) or "<|python_tag|>{...}".
      const size_t i = b.starts_with(marker_) ? skip_space(b, marker_.size()) : 0;
      if (i == b.size()) {
        if (at_end) malformed(buf_.size(), out);
        return at_end;
      }
      if (b[i] != '{') {
        // <|python_tag|> and code, not JSON: it runs to the end of the output.
        if (at_end) malformed(buf_.size(), out);
        return at_end;
      }
      const size_t e = json_extent(b, i);
      if (e == std::string_view::npos) {
        if (at_end) malformed(buf_.size(), out);
        return at_end;
      }
      std::optional<ToolCall> call = call_from_json_text(b.substr(i, e - i));
      if (call)
        completed({std::move(*call)}, e, out);
      else
        malformed(e, out);
      return true;
    }
    case ToolCallFormat::Pythonic: {
      const size_t e = pythonic_extent(b, 0);
      if (e == std::string_view::npos) {
        if (at_end) malformed(buf_.size(), out);
        return at_end;
      }
      std::optional<std::vector<ToolCall>> calls = parse_pythonic_calls(b.substr(0, e));
      if (calls)
        completed(std::move(*calls), e, out);
      else
        malformed(e, out);
      return true;
    }
    case ToolCallFormat::Mistral: {
      // One call per marker; the next marker (or the end) bounds this one.
      const size_t next = b.find(marker_, std::max(marker_.size(), searched_));
      searched_ = b.size() - std::min(b.size(), marker_.size() - 1);
      const bool bounded = next != std::string_view::npos || at_end;
      const size_t bound = next != std::string_view::npos ? next : b.size();
      const std::string_view upto = b.substr(0, bound);
      auto undecided = [&]() {
        if (!bounded) return false;
        malformed(bound, out);
        return true;
      };
      const size_t i = skip_space(upto, marker_.size());
      if (i == upto.size()) return undecided();
      if (upto[i] == '[') {
        // [{"name": ..., "arguments": ...}, ...]
        const size_t e = json_extent(upto, i);
        if (e == std::string_view::npos) return undecided();
        ojson arr = ojson::parse(upto.substr(i, e - i), nullptr, false);
        std::vector<ToolCall> calls;
        bool ok = arr.is_array() && !arr.empty();
        for (size_t k = 0; ok && k < arr.size(); ++k) {
          std::optional<ToolCall> c = tool_call_from_json(arr[k]);
          if (c)
            calls.push_back(std::move(*c));
          else
            ok = false;
        }
        if (ok)
          completed(std::move(calls), e, out);
        else
          malformed(e, out);
        return true;
      }
      // NAME[ARGS]{...}, or NAME[CALL_ID]ID[ARGS]{...}
      const size_t args = upto.find("[ARGS]", i);
      if (args == std::string_view::npos) return undecided();
      std::string_view name = upto.substr(i, args - i);
      if (const size_t id = name.find("[CALL_ID]"); id != std::string_view::npos)
        name = name.substr(0, id);
      name = trim(name);
      const size_t j = skip_space(upto, args + 6);
      if (j == upto.size() || upto[j] != '{') return undecided();
      const size_t e = json_extent(upto, j);
      if (e == std::string_view::npos) return undecided();
      ojson a = ojson::parse(upto.substr(j, e - j), nullptr, false);
      if (valid_name(name) && a.is_object())
        completed({ToolCall{std::string(name), compact(a)}}, e, out);
      else
        malformed(e, out);
      return true;
    }
  }
  return false;
}

bool parse_bare_scalar(std::string_view word, ojson& out) {
  if (word == "true" || word == "True") {
    out = true;
  } else if (word == "false" || word == "False") {
    out = false;
  } else if (word == "null" || word == "None") {
    out = nullptr;
  } else {
    ojson j = ojson::parse(word, nullptr, false);
    if (j.is_discarded() || !j.is_number()) return false;
    out = std::move(j);
  }
  return true;
}

}  // namespace tandem::text
