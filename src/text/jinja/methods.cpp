// Methods templates call on values: str.strip(), dict.items(), ... As in
// transformers' ImmutableSandboxedEnvironment, methods that mutate a list or
// dict are unsafe: reaching them gives an undefined value that fails when
// called.
#include <algorithm>

#include "text/jinja/args.h"
#include "text/jinja/ops.h"
#include "text/jinja/pyfmt.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

namespace {

using Fn = std::function<Value(Interpreter&, CallArgs&)>;

Value bound(const std::string& name, Fn fn) {
  return Value::function(name, std::move(fn));
}

Value unsafe(const std::string& name, const Value& self) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(self) +
                          "' object is unsafe.");
}

// Code-point window [start, end) of s from Python's optional start/end args.
std::pair<size_t, size_t> window(const std::vector<uint32_t>& cps, const Value* a, const Value* b) {
  const int64_t n = int64_t(cps.size());
  auto fix = [&](const Value* v, int64_t d) {
    if (!v || v->is_none()) return d;
    int64_t x = int_arg(*v, "slice index");
    if (x < 0) x = std::max<int64_t>(0, x + n);
    return std::min(x, n);
  };
  int64_t s = fix(a, 0), e = fix(b, n);
  return {size_t(s), size_t(std::max(s, e))};
}

int64_t find_cp(const std::string& hay, const std::string& needle, const Value* a, const Value* b,
                bool reverse) {
  std::vector<uint32_t> h = str::to_cps(hay), nd = str::to_cps(needle);
  auto [s, e] = window(h, a, b);
  if (nd.size() > e - s) return -1;
  if (!reverse) {
    for (size_t k = s; k + nd.size() <= e; ++k)
      if (std::equal(nd.begin(), nd.end(), h.begin() + long(k))) return int64_t(k);
  } else {
    for (size_t k = e - nd.size() + 1; k-- > s;)
      if (std::equal(nd.begin(), nd.end(), h.begin() + long(k))) return int64_t(k);
  }
  return -1;
}

bool affix_match(const Value& self, const Value& affix, const Value* a, const Value* b, bool end,
                 const char* fname) {
  std::vector<uint32_t> h = str::to_cps(self.s);
  const auto win = window(h, a, b);
  const size_t s = win.first, e = win.second;
  auto one = [&](const Value& p) {
    if (!p.is_string())
      fail("%s first arg must be str or a tuple of str, not %s", fname, type_name(p));
    std::vector<uint32_t> x = str::to_cps(p.s);
    if (x.size() > e - s) return false;
    return end ? std::equal(x.begin(), x.end(), h.begin() + long(e - x.size()))
               : std::equal(x.begin(), x.end(), h.begin() + long(s));
  };
  if (affix.is_list() && affix.list->tuple) {
    for (const auto& p : affix.list->items)
      if (one(p)) return true;
    return false;
  }
  return one(affix);
}

Value str_list(const std::vector<std::string>& parts) {
  std::vector<Value> v;
  v.reserve(parts.size());
  for (const auto& p : parts) v.push_back(Value::string(p));
  return Value::new_list(std::move(v));
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where) {
  const int64_t n = int64_t(str::length(s));
  if (width <= n) return s;
  const int64_t marg = width - n;
  int64_t left = where < 0 ? 0 : where > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

// str.format with auto/explicit positional and keyword fields, no specs.
std::string py_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      size_t e = fmt.find('}', i);
      if (e == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!") != std::string::npos)
        fail("format specs and conversions in str.format are not supported");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_idx >= args.pos.size()) fail("Replacement index %zu out of range", auto_idx);
        v = &args.pos[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        size_t k = std::stoul(field);
        if (k >= args.pos.size()) fail("Replacement index %zu out of range", k);
        v = &args.pos[k];
      } else {
        v = args.kwarg(field);
        if (!v) fail("KeyError: '%s'", field.c_str());
      }
      out += py_str(*v);
      i = e;
    } else if (c == '}') {
      fail("Single '}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool str_method(const Value& self, const std::string& name, Value& out) {
  const std::string s = self.s;
  auto strip_fn = [&](bool l, bool r) {
    return bound(name, [s, l, r, name](Interpreter&, CallArgs& a) {
      Params p(a, {"chars"}, name);
      if (p.has(0) && !p[0]->is_none())
        return Value::string(str::strip(s, &str_arg(*p[0], "chars"), l, r));
      return Value::string(str::strip(s, nullptr, l, r));
    });
  };
  auto unary = [&](std::string (*f)(std::string_view)) {
    return bound(name, [s, f, name](Interpreter&, CallArgs& a) {
      Params p(a, {}, name);
      return Value::string(f(s));
    });
  };
  auto pred = [&](bool (*f)(uint32_t), bool need_all) {
    return bound(name, [s, f, name](Interpreter&, CallArgs& a) {
      Params p(a, {}, name);
      if (s.empty()) return Value::boolean(false);
      for (size_t i = 0; i < s.size();)
        if (!f(str::decode(s, i))) return Value::boolean(false);
      return Value::boolean(true);
    });
  };
  if (name == "strip") return out = strip_fn(true, true), true;
  if (name == "lstrip") return out = strip_fn(true, false), true;
  if (name == "rstrip") return out = strip_fn(false, true), true;
  if (name == "upper") return out = unary(&str::upper), true;
  if (name == "lower" || name == "casefold") return out = unary(&str::lower), true;
  if (name == "title") return out = unary(&str::py_title), true;
  if (name == "capitalize") return out = unary(&str::capitalize), true;
  if (name == "swapcase") return out = unary(&str::swapcase), true;
  if (name == "split" || name == "rsplit") {
    const bool r = name == "rsplit";
    out = bound(name, [s, r, name](Interpreter&, CallArgs& a) {
      Params p(a, {"sep", "maxsplit"}, name);
      const int64_t maxsplit = p.has(1) ? int_arg(*p[1], "maxsplit") : -1;
      const std::string* sep = nullptr;
      if (p.has(0) && !p[0]->is_none()) {
        sep = &str_arg(*p[0], "sep");
        if (sep->empty()) fail("empty separator");
      }
      return str_list(r ? str::rsplit(s, sep, maxsplit) : str::split(s, sep, maxsplit));
    });
    return true;
  }
  if (name == "splitlines") {
    out = bound(name, [s, name](Interpreter&, CallArgs& a) {
      Params p(a, {"keepends"}, name);
      return str_list(str::splitlines(s, p.has(0) && truthy(*p[0])));
    });
    return true;
  }
  if (name == "startswith" || name == "endswith") {
    const bool end = name == "endswith";
    Value selfv = self;
    out = bound(name, [selfv, end, name](Interpreter&, CallArgs& a) {
      Params p(a, {"prefix", "start", "end"}, name);
      if (!p[0]) fail("%s() takes at least 1 argument (0 given)", name.c_str());
      return Value::boolean(affix_match(selfv, *p[0], p[1], p[2], end, name.c_str()));
    });
    return true;
  }
  if (name == "replace") {
    out = bound(name, [s, name](Interpreter&, CallArgs& a) {
      Params p(a, {"old", "new", "count"}, name);
      if (!p[0] || !p[1]) fail("replace() takes at least 2 arguments");
      const int64_t n = p.has(2) ? int_arg(*p[2], "count") : -1;
      return Value::string(str::replace(s, str_arg(*p[0], "replace() argument 1"),
                                        str_arg(*p[1], "replace() argument 2"), n));
    });
    return true;
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const bool rev = name[0] == 'r';
    const bool raise = name.find("index") != std::string::npos;
    out = bound(name, [s, rev, raise, name](Interpreter&, CallArgs& a) {
      Params p(a, {"sub", "start", "end"}, name);
      if (!p[0]) fail("%s() takes at least 1 argument (0 given)", name.c_str());
      int64_t k = find_cp(s, str_arg(*p[0], "must"), p[1], p[2], rev);
      if (k < 0 && raise) fail("substring not found");
      return Value::integer(k);
    });
    return true;
  }
  if (name == "count") {
    out = bound(name, [s, name](Interpreter&, CallArgs& a) {
      Params p(a, {"sub"}, name);
      if (!p[0]) fail("count() takes at least 1 argument (0 given)");
      return Value::integer(int64_t(str::count(s, str_arg(*p[0], "must"))));
    });
    return true;
  }
  if (name == "join") {
    out = bound(name, [s, name](Interpreter&, CallArgs& a) {
      Params p(a, {"iterable"}, name);
      if (!p[0]) fail("join() takes exactly one argument (0 given)");
      std::string r;
      size_t k = 0;
      for (const auto& v : iterate(*p[0])) {
        if (!v.is_string())
          fail("sequence item %zu: expected str instance, %s found", k, type_name(v));
        if (k++) r += s;
        r += v.s;
      }
      return Value::string(std::move(r));
    });
    return true;
  }
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return out = pred(&str::is_digit, true), true;
  if (name == "isalpha") return out = pred(&str::is_alpha, true), true;
  if (name == "isspace") return out = pred(&str::is_space, true), true;
  if (name == "isalnum")
    return out = pred([](uint32_t c) { return str::is_alpha(c) || str::is_digit(c); }, true), true;
  if (name == "isupper" || name == "islower") {
    const bool up = name == "isupper";
    out = bound(name, [s, up, name](Interpreter&, CallArgs& a) {
      Params p(a, {}, name);
      bool any = false;
      for (size_t i = 0; i < s.size();) {
        uint32_t c = str::decode(s, i);
        const bool is_up = str::to_lower(c) != c, is_low = str::to_upper(c) != c;
        if (up ? is_low : is_up) return Value::boolean(false);
        any |= up ? is_up : is_low;
      }
      return Value::boolean(any);
    });
    return true;
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int where = name == "center" ? 0 : name == "ljust" ? -1 : 1;
    out = bound(name, [s, where, name](Interpreter&, CallArgs& a) {
      Params p(a, {"width", "fillchar"}, name);
      if (!p[0]) fail("%s() takes at least 1 argument (0 given)", name.c_str());
      std::string fill = p.has(1) ? str_arg(*p[1], "fillchar") : " ";
      if (str::length(fill) != 1) fail("The fill character must be exactly one character long");
      return Value::string(pad(s, int_arg(*p[0], "width"), fill, where));
    });
    return true;
  }
  if (name == "zfill") {
    out = bound(name, [s, name](Interpreter&, CallArgs& a) {
      Params p(a, {"width"}, name);
      if (!p[0]) fail("zfill() takes exactly one argument (0 given)");
      int64_t w = int_arg(*p[0], "width"), n = int64_t(str::length(s));
      if (w <= n) return Value::string(s);
      std::string body = s, sign;
      if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
        sign = body.substr(0, 1);
        body = body.substr(1);
      }
      return Value::string(sign + std::string(size_t(w - n), '0') + body);
    });
    return true;
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool pre = name == "removeprefix";
    out = bound(name, [s, pre, name](Interpreter&, CallArgs& a) {
      Params p(a, {"affix"}, name);
      if (!p[0]) fail("%s() takes exactly one argument (0 given)", name.c_str());
      const std::string& x = str_arg(*p[0], "argument");
      if (pre && str::starts_with(s, x)) return Value::string(s.substr(x.size()));
      if (!pre && !x.empty() && str::ends_with(s, x))
        return Value::string(s.substr(0, s.size() - x.size()));
      return Value::string(s);
    });
    return true;
  }
  if (name == "partition" || name == "rpartition") {
    const bool rev = name[0] == 'r';
    out = bound(name, [s, rev, name](Interpreter&, CallArgs& a) {
      Params p(a, {"sep"}, name);
      if (!p[0]) fail("%s() takes exactly one argument (0 given)", name.c_str());
      const std::string& sep = str_arg(*p[0], "sep");
      if (sep.empty()) fail("empty separator");
      size_t at = rev ? s.rfind(sep) : s.find(sep);
      std::vector<Value> v;
      if (at == std::string::npos) {
        v = rev ? std::vector<Value>{Value::string(""), Value::string(""), Value::string(s)}
                : std::vector<Value>{Value::string(s), Value::string(""), Value::string("")};
      } else {
        v = {Value::string(s.substr(0, at)), Value::string(sep),
             Value::string(s.substr(at + sep.size()))};
      }
      return Value::new_list(std::move(v), true);
    });
    return true;
  }
  if (name == "format") {
    out = bound(name, [s](Interpreter&, CallArgs& a) { return Value::string(py_format(s, a)); });
    return true;
  }
  return false;
}

bool dict_method(const Value& self, const std::string& name, Value& out) {
  auto d = self.dict;
  if (name == "items" || name == "keys" || name == "values") {
    const int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    out = bound(name, [d, which, name](Interpreter&, CallArgs& a) {
      Params p(a, {}, name);
      std::vector<Value> v;
      v.reserve(d->items.size());
      for (const auto& kv : d->items) {
        if (which == 0)
          v.push_back(Value::new_list({kv.first, kv.second}, true));
        else
          v.push_back(which == 1 ? kv.first : kv.second);
      }
      return Value::new_list(std::move(v));
    });
    return true;
  }
  if (name == "get") {
    out = bound(name, [d, name](Interpreter&, CallArgs& a) {
      if (!a.kw.empty()) fail("get() takes no keyword arguments");
      Params p(a, {"key", "default"}, name);
      if (!p[0]) fail("get expected at least 1 argument, got 0");
      if (const Value* v = d->find(*p[0])) return *v;
      return p[1] ? *p[1] : Value::none();
    });
    return true;
  }
  if (name == "copy") {
    out = bound(name, [d](Interpreter&, CallArgs&) {
      Value v = Value::new_dict();
      v.dict->items = d->items;
      return v;
    });
    return true;
  }
  if (name == "pop" || name == "popitem" || name == "update" || name == "setdefault" ||
      name == "clear") {
    out = unsafe(name, self);
    return true;
  }
  return false;
}

bool list_method(const Value& self, const std::string& name, Value& out) {
  auto l = self.list;
  if (name == "index" || name == "count") {
    const bool idx = name == "index";
    out = bound(name, [l, idx, name](Interpreter&, CallArgs& a) {
      Params p(a, {"value"}, name);
      if (!p[0]) fail("%s() takes exactly one argument (0 given)", name.c_str());
      int64_t n = 0;
      for (size_t k = 0; k < l->items.size(); ++k) {
        if (!equals(l->items[k], *p[0])) continue;
        if (idx) return Value::integer(int64_t(k));
        ++n;
      }
      if (idx) fail("%s is not in list", py_repr(*p[0]).c_str());
      return Value::integer(n);
    });
    return true;
  }
  if (!l->tuple && name == "copy") {
    out = bound(name, [l](Interpreter&, CallArgs&) { return Value::new_list(l->items); });
    return true;
  }
  if (!l->tuple && (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
                    name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
    out = unsafe(name, self);
    return true;
  }
  return false;
}

}  // namespace

bool find_method(const Value& self, const std::string& name, Value& out) {
  switch (self.kind) {
    case Kind::String: return str_method(self, name, out);
    case Kind::Dict: return dict_method(self, name, out);
    case Kind::List: return self.list->gen_type ? false : list_method(self, name, out);
    default: return false;
  }
}

}  // namespace tandem::jinja
