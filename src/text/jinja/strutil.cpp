#include "text/jinja/strutil.h"

#include <algorithm>

namespace tandem::jinja::str {

uint32_t decode(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 1;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 2;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 3;
    cp = b0 & 0x07;
  } else {
    ++i;
    return b0;
  }
  if (i + n >= s.size()) {
    ++i;
    return b0;
  }
  for (int k = 1; k <= n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  i += n + 1;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::vector<uint32_t> to_cps(std::string_view s) {
  std::vector<uint32_t> v;
  v.reserve(s.size());
  for (size_t i = 0; i < s.size();) v.push_back(decode(s, i));
  return v;
}

std::string from_cps(const uint32_t* cps, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t k = 0; k < n; ++k) append_utf8(out, cps[k]);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode(s, i);
  return n;
}

bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_digit(uint32_t c) {
  return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) ||
         (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19);
}

namespace {

// Pairs laid out as alternating upper (even) / lower (odd) code points.
bool in_even_odd_pairs(uint32_t c) {
  return (c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177) ||
         (c >= 0x182 && c <= 0x185) || (c >= 0x1A0 && c <= 0x1A5) || (c >= 0x1DE && c <= 0x1EF) ||
         (c >= 0x1F8 && c <= 0x21F) || (c >= 0x222 && c <= 0x233) || (c >= 0x3D8 && c <= 0x3EF) ||
         (c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F) ||
         (c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF);
}
// Pairs laid out as upper (odd) / lower (even).
bool in_odd_even_pairs(uint32_t c) {
  return (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E) || (c >= 0x4C1 && c <= 0x4CE) ||
         (c >= 0x1CD && c <= 0x1DC);
}

}  // namespace

uint32_t to_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if (in_even_odd_pairs(c)) return (c & 1) ? c - 1 : c;
  if (in_odd_even_pairs(c)) return (c & 1) ? c : c - 1;
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c == 0x130) return 'i';
  if (in_even_odd_pairs(c)) return (c & 1) ? c : c + 1;
  if (in_odd_even_pairs(c)) return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

static bool is_cased(uint32_t c) {
  return to_upper(c) != c || to_lower(c) != c || c == 0xDF;
}

bool is_alpha(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return is_cased(c) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) ||
         (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A);
}

bool is_printable(uint32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F) return false;
  if (c == 0x1680 || c == 0x180E) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000) return false;
  if (c >= 0xD800 && c <= 0xF8FF) return false;
  if (c == 0xFEFF || (c >= 0xFFF0 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) return false;
  if (c >= 0xE0000 || c > 0x10FFFF) return false;
  return true;
}

template <typename F>
static std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) f(out, decode(s, i));
  return out;
}

std::string upper(std::string_view s) {
  return map_cps(s, [](std::string& o, uint32_t c) {
    if (c == 0xDF) {
      o += "SS";
      return;
    }
    append_utf8(o, to_upper(c));
  });
}

std::string lower(std::string_view s) {
  return map_cps(s, [](std::string& o, uint32_t c) { append_utf8(o, to_lower(c)); });
}

std::string swapcase(std::string_view s) {
  return map_cps(s, [](std::string& o, uint32_t c) {
    uint32_t u = to_upper(c);
    append_utf8(o, u != c ? u : to_lower(c));
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_cps(s, [&](std::string& o, uint32_t c) {
    append_utf8(o, first ? to_upper(c) : to_lower(c));
    first = false;
  });
}

std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](std::string& o, uint32_t c) {
    const bool cased = is_cased(c);
    append_utf8(o, cased ? (prev_cased ? to_lower(c) : to_upper(c)) : c);
    prev_cased = cased;
  });
}

std::string jinja_title(std::string_view s) {
  // re.split(r"([-\s({\[<]+)") then item[0].upper() + item[1:].lower().
  auto is_sep = [](uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
  };
  std::string out;
  bool at_item_start = true;
  bool prev_sep = false;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    const bool sep = is_sep(c);
    if (first || sep != prev_sep) at_item_start = true;
    first = false;
    prev_sep = sep;
    if (at_item_start) {
      append_utf8(out, to_upper(c));
      at_item_start = false;
    } else {
      append_utf8(out, to_lower(c));
    }
  }
  return out;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = to_cps(s);
  std::vector<uint32_t> set;
  if (chars) set = to_cps(*chars);
  auto drop = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return from_cps(cps.data() + b, e - b);
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::vector<uint32_t> cps = to_cps(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && is_space(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
      size_t e = n;
      while (e > i && is_space(cps[e - 1])) --e;
      out.push_back(from_cps(cps.data() + i, e - i));
      break;
    }
    size_t j = i;
    while (j < n && !is_space(cps[j])) ++j;
    out.push_back(from_cps(cps.data() + i, j - i));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<uint32_t> cps = to_cps(s);
  size_t e = cps.size();
  while (true) {
    while (e > 0 && is_space(cps[e - 1])) --e;
    if (e == 0) break;
    if (int64_t(out.size()) >= maxsplit) {
      size_t b = 0;
      while (b < e && is_space(cps[b])) ++b;
      out.push_back(from_cps(cps.data() + b, e - b));
      break;
    }
    size_t b = e;
    while (b > 0 && !is_space(cps[b - 1])) --b;
    out.push_back(from_cps(cps.data() + b, e - b));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<uint32_t> cps = to_cps(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0, n = cps.size();
  while (i < n) {
    uint32_t c = cps[i];
    size_t eol = 0;
    if (c == '\r' && i + 1 < n && cps[i + 1] == '\n')
      eol = 2;
    else if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
             c == 0x85 || c == 0x2028 || c == 0x2029)
      eol = 1;
    if (eol) {
      size_t end = keepends ? i + eol : i;
      out.push_back(from_cps(cps.data() + start, end - start));
      i += eol;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < n) out.push_back(from_cps(cps.data() + start, n - start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every code point and at the end.
    int64_t done = 0;
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i == s.size()) break;
      size_t j = i;
      decode(s, j);
      out += s.substr(i, j - i);
      i = j;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out += s.substr(pos, at - pos);
    out += with;
    pos = at + old.size();
    ++done;
  }
  out += s.substr(pos);
  return out;
}

size_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return length(s) + 1;
  size_t n = 0, pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace tandem::jinja::str
