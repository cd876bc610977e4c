#include "text/jinja/pyfmt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "core/error.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci = [-]D[.DDD]e[+-]XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp + 1;
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    const int nd = int(digits.size());
    if (decpt <= 0) {
      out += "0.";
      out.append(size_t(-decpt), '0');
      out += digits;
    } else if (decpt >= nd) {
      out += digits;
      out.append(size_t(decpt - nd), '0');
      out += ".0";
    } else {
      out += digits.substr(0, size_t(decpt));
      out += ".";
      out += digits.substr(size_t(decpt));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += ".";
      out += digits.substr(1);
    }
    out += "e";
    out += exp < 0 ? "-" : "+";
    int ax = exp < 0 ? -exp : exp;
    if (ax < 10) out += "0";
    out += std::to_string(ax);
  }
  return out;
}

std::string py_string_repr(std::string_view s) {
  const bool has_sq = s.find('\'') != std::string_view::npos;
  const bool has_dq = s.find('"') != std::string_view::npos;
  const char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = str::decode(s, i);
    if (c == uint32_t(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (str::is_printable(c)) {
      str::append_utf8(out, c);
    } else if (c < 0x100) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (c < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      std::snprintf(buf, sizeof buf, "\\U%08x", c);
      out += buf;
    }
  }
  out.push_back(q);
  return out;
}

static void repr_into(std::string& out, const Value& v, int depth) {
  if (depth > 200) fail("maximum recursion depth exceeded while getting the repr of an object");
  switch (v.kind) {
    case Kind::String:
      out += v.safe ? "Markup(" + py_string_repr(v.s) + ")" : py_string_repr(v.s);
      return;
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::List: {
      if (v.list->gen_type) {
        out += std::string("<") + v.list->gen_type + " object>";
        return;
      }
      const bool tup = v.list->tuple;
      out += tup ? "(" : "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        repr_into(out, v.list->items[k], depth + 1);
      }
      if (tup && v.list->items.size() == 1) out += ",";
      out += tup ? ")" : "]";
      return;
    }
    case Kind::Dict: {
      out += "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, kv.first, depth + 1);
        out += ": ";
        repr_into(out, kv.second, depth + 1);
      }
      out += "}";
      return;
    }
    default: out += py_str(v); return;
  }
}

std::string py_repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::List:
    case Kind::Dict: return py_repr(v);
    case Kind::Object: return v.obj->repr();
    case Kind::Func:
      return v.fn->is_macro ? "<Macro '" + v.fn->name + "'>"
                            : "<built-in function " + v.fn->name + ">";
  }
  return "";
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t c = str::decode(s, i);
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (ensure_ascii && c >= 0x7F) {
      if (c == 0x7F) {
        out.push_back(char(0x7F));
      } else if (c >= 0x10000) {
        const uint32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
        out += buf;
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      }
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out.push_back('"');
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Kind::String: return k.s;
    case Kind::Int: return std::to_string(k.i);
    case Kind::Bool: return k.b ? "true" : "false";
    case Kind::None: return "null";
    case Kind::Float: {
      if (std::isnan(k.f)) return "NaN";
      if (std::isinf(k.f)) return k.f < 0 ? "-Infinity" : "Infinity";
      return py_float_repr(k.f);
    }
    default: fail("keys must be str, int, float, bool or None, not %s", type_name(k));
  }
}

struct JsonWriter {
  const JsonOptions& o;
  std::string out;
  std::string item_sep, key_sep;

  void newline(int level) {
    out.push_back('\n');
    for (int k = 0; k < level; ++k) out += *o.indent;
  }

  void write(const Value& v, int level) {
    if (level > 500) fail("maximum recursion depth exceeded while encoding a JSON object");
    switch (v.kind) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.b ? "true" : "false"; return;
      case Kind::Int: out += std::to_string(v.i); return;
      case Kind::Float:
        if (std::isnan(v.f))
          out += "NaN";
        else if (std::isinf(v.f))
          out += v.f < 0 ? "-Infinity" : "Infinity";
        else
          out += py_float_repr(v.f);
        return;
      case Kind::String: json_string(out, v.s, o.ensure_ascii); return;
      case Kind::List: {
        if (v.list->gen_type) fail("Object of type %s is not JSON serializable", v.list->gen_type);
        const auto& items = v.list->items;
        if (items.empty()) {
          out += "[]";
          return;
        }
        out.push_back('[');
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep;
          if (o.indent) newline(level + 1);
          write(items[k], level + 1);
        }
        if (o.indent) newline(level);
        out.push_back(']');
        return;
      }
      case Kind::Dict: {
        std::vector<const std::pair<Value, Value>*> items;
        for (const auto& kv : v.dict->items) items.push_back(&kv);
        if (items.empty()) {
          out += "{}";
          return;
        }
        if (o.sort_keys) {
          for (auto* kv : items)
            if (kv->first.kind != Kind::String)
              fail("'<' not supported between instances of '%s' and 'str'", type_name(kv->first));
          std::stable_sort(items.begin(), items.end(),
                           [](auto* a, auto* b) { return a->first.s < b->first.s; });
        }
        out.push_back('{');
        bool first = true;
        for (auto* kv : items) {
          if (!first) out += item_sep;
          first = false;
          if (o.indent) newline(level + 1);
          json_string(out, json_key(kv->first), o.ensure_ascii);
          out += key_sep;
          write(kv->second, level + 1);
        }
        if (o.indent) newline(level);
        out.push_back('}');
        return;
      }
      default: fail("Object of type %s is not JSON serializable", type_name(v));
    }
  }
};

}  // namespace

// Python's "%" string formatting for the |format filter.
std::string percent_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t argi = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    const Value* v = nullptr;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) fail("incomplete format key");
      v = a.kwarg(fmt.substr(i + 1, e - i - 1));
      if (!v) fail("format requires a mapping");
      i = e + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos)
      flags.push_back(fmt[i++]);
    std::string width, prec;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
      width.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])))
        prec.push_back(fmt[i++]);
      if (prec.empty()) prec = "0";
    }
    if (i >= fmt.size()) fail("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!v) {
      if (argi >= a.pos.size()) fail("not enough arguments for format string");
      v = &a.pos[argi++];
    }
    std::string spec = "%" + flags + width + (prec.empty() ? "" : "." + prec);
    char buf[512];
    std::string piece;
    switch (conv) {
      case 's':
      case 'r': {
        std::string s = conv == 's' ? py_str(*v) : py_repr(*v);
        if (!prec.empty()) s = s.substr(0, std::stoul(prec));
        const size_t w = width.empty() ? 0 : std::stoul(width);
        const size_t n = str::length(s);
        if (n < w) {
          if (flags.find('-') != std::string::npos)
            s += std::string(w - n, ' ');
          else
            s = std::string(w - n, ' ') + s;
        }
        piece = s;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!v->is_number())
          fail("%%%c format: a real number is required, not %s", conv, type_name(*v));
        long long n = v->kind == Kind::Float ? (long long)v->f : (long long)v->as_int();
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
        piece = buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v->is_number()) fail("must be real number, not %s", type_name(*v));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v->as_double());
        piece = buf;
        break;
      }
      default: fail("unsupported format character '%c'", conv);
    }
    out += piece;
  }
  if (argi < a.pos.size()) fail("not all arguments converted during string formatting");
  return out;
}

std::string json_dumps(const Value& v, const JsonOptions& o) {
  JsonWriter w{o, {}, {}, {}};
  w.item_sep = o.item_sep ? *o.item_sep : (o.indent ? "," : ", ");
  w.key_sep = o.key_sep ? *o.key_sep : ": ";
  w.write(v, 0);
  return w.out;
}

}  // namespace tandem::jinja
