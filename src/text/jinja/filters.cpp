// Jinja's builtin filters, with the Python semantics of jinja2/filters.py, and
// transformers' tojson override (json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/jinja/args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/ops.h"
#include "text/jinja/parser.h"
#include "text/jinja/pyfmt.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

namespace {

const std::string kDot = ".", kComma = ",";

// str() keeping Markup (jinja's soft_str).
Value soft_str(const Value& v) {
  if (v.is_string()) return v;
  return Value::string(py_str(v));
}

std::vector<Value> attr_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  for (const auto& p : str::split(attribute.s, &kDot, -1)) {
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
    parts.push_back(digits ? Value::integer(std::strtoll(p.c_str(), nullptr, 10))
                           : Value::string(p));
  }
  return parts;
}

Value lookup_path(const Value& item, const std::vector<Value>& parts, const Value* dflt) {
  Value cur = item;
  for (const auto& p : parts) {
    if (cur.kind == Kind::Object) {
      Value out;
      cur = p.is_string() && cur.obj->get_attr(p.s, out) ? out : Value::undefined("no attribute");
    } else {
      cur = getitem(cur, p);
    }
    if (dflt && cur.is_undefined()) cur = *dflt;
  }
  return cur;
}

Value ignore_case(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(str::lower(v.s));
  return v;
}

std::vector<Value> as_items(const Value& v) {
  return iterate(v);
}

Value to_list(std::vector<Value> items) {
  return Value::new_list(std::move(items));
}

// What Jinja returns as a lazy generator (map, select, unique, ...).
Value to_gen(std::vector<Value> items, const char* type = "generator") {
  Value v = Value::new_list(std::move(items));
  v.list->gen_type = type;
  return v;
}

std::string do_indent(const std::string& s, const Value& width, bool first, bool blank) {
  std::string ind = width.is_string()
                        ? width.s
                        : std::string(size_t(std::max<int64_t>(0, int_arg(width, "width"))), ' ');
  std::vector<std::string> lines = str::splitlines(s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += "\n";
      if (!lines[k].empty()) rv += ind;
      rv += lines[k];
    }
  }
  if (first) rv = ind + rv;
  return rv;
}

// Python's int(str, base) for the |int filter; false when not an integer.
bool parse_int(const std::string& text, int base, int64_t& out) {
  std::string t = str::strip(text, nullptr, true, true);
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] == '_' && k > 0 && k + 1 < t.size() &&
        std::isalnum(static_cast<unsigned char>(t[k - 1])) &&
        std::isalnum(static_cast<unsigned char>(t[k + 1])))
      continue;
    clean.push_back(t[k]);
  }
  if (clean.empty()) return false;
  size_t k = 0;
  if (clean[0] == '+' || clean[0] == '-') ++k;
  if (k >= clean.size()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(clean.c_str(), &end, base);
  if (errno || *end != '\0' || end == clean.c_str()) return false;
  for (size_t j = k; j < clean.size(); ++j)
    if (!std::isalnum(static_cast<unsigned char>(clean[j]))) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& text, double& out) {
  std::string t = str::strip(text, nullptr, true, true);
  std::string clean;
  for (char c : t)
    if (c != '_') clean.push_back(c);
  if (clean.empty()) return false;
  std::string low = str::lower(clean);
  if (low == "inf" || low == "+inf" || low == "infinity" || low == "+infinity") {
    out = INFINITY;
    return true;
  }
  if (low == "-inf" || low == "-infinity") {
    out = -INFINITY;
    return true;
  }
  if (low == "nan" || low == "+nan" || low == "-nan") {
    out = NAN;
    return true;
  }
  if (low.find_first_not_of("0123456789+-.e") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end && *end == '\0';
}

double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0 && ndigits <= 300) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, double(-ndigits));
  double y = x / p;
  double r = std::nearbyint(y);
  return r * p;
}

std::vector<Value> sorted_values(std::vector<Value> items,
                                 const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& it : items) keyed.emplace_back(key(it), std::move(it));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

JsonOptions json_options(const Params& p) {
  JsonOptions o;
  if (p.has(0)) o.ensure_ascii = truthy(*p[0]);
  if (p.has(1) && !p[1]->is_none()) {
    const Value& ind = *p[1];
    if (ind.is_string())
      o.indent = ind.s;
    else
      o.indent = std::string(size_t(std::max<int64_t>(0, int_arg(ind, "indent"))), ' ');
  }
  if (p.has(2) && !p[2]->is_none()) {
    std::vector<Value> seps = iterate(*p[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      fail("separators must be a (item_separator, key_separator) pair of strings");
    o.item_sep = seps[0].s;
    o.key_sep = seps[1].s;
  }
  if (p.has(3)) o.sort_keys = truthy(*p[3]);
  return o;
}

}  // namespace

static Value filter_impl(Interpreter& in, const std::string& name, const Value& v, CallArgs& a);

// Jinja's map/select/reject/selectattr/rejectattr/unique/items/batch are
// generators: their errors surface only when the result is iterated.
Value builtin_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  static const char* const kLazy[] = {"map",    "select", "reject", "selectattr", "rejectattr",
                                      "unique", "items",  "batch",  "slice"};
  bool lazy = false;
  for (const char* l : kLazy) lazy |= name == l;
  if (!lazy) return filter_impl(in, name, v, a);
  try {
    return filter_impl(in, name, v, a);
  } catch (const TemplateError& e) {
    Value g = to_gen({});
    g.list->deferred_error = e.message();
    return g;
  } catch (const tandem::Error& e) {
    Value g = to_gen({});
    g.list->deferred_error = e.what();
    return g;
  }
}

static Value filter_impl(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const std::string& n = name;
  auto P = [&](std::initializer_list<const char*> names) { return Params(a, names, n); };

  if (n == "tojson") {
    Params p = P({"ensure_ascii", "indent", "separators", "sort_keys"});
    return Value::string(json_dumps(v, json_options(p)));
  }
  if (n == "default" || n == "d") {
    Params p = P({"default_value", "boolean"});
    const bool boolean = p.has(1) && truthy(*p[1]);
    if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
    return v;
  }
  if (n == "length" || n == "count") {
    P({});
    return Value::integer(length(v));
  }
  if (n == "trim") {
    Params p = P({"chars"});
    Value s = soft_str(v);
    if (p.has(0) && !p[0]->is_none())
      return Value::string(str::strip(s.s, &str_arg(*p[0], "strip arg"), true, true), s.safe);
    return Value::string(str::strip(s.s, nullptr, true, true), s.safe);
  }
  if (n == "upper" || n == "lower" || n == "capitalize" || n == "title") {
    P({});
    Value s = soft_str(v);
    std::string r = n == "upper"        ? str::upper(s.s)
                    : n == "lower"      ? str::lower(s.s)
                    : n == "capitalize" ? str::capitalize(s.s)
                                        : str::jinja_title(s.s);
    return Value::string(std::move(r), s.safe);
  }
  if (n == "string") {
    P({});
    return soft_str(v);
  }
  if (n == "safe") {
    P({});
    return Value::string(v.is_string() ? v.s : py_str(v), true);
  }
  if (n == "escape" || n == "e" || n == "forceescape") {
    P({});
    if (v.is_string() && v.safe && n != "forceescape") return v;
    return Value::string(str::html_escape(v.is_string() ? v.s : py_str(v)), true);
  }
  if (n == "replace") {
    Params p = P({"old", "new", "count"});
    if (!p[0] || !p[1]) fail("replace filter needs old and new");
    const int64_t count = p.has(2) && !p[2]->is_none() ? int_arg(*p[2], "count") : -1;
    return Value::string(str::replace(py_str(v), py_str(*p[0]), py_str(*p[1]), count));
  }
  if (n == "join") {
    Params p = P({"d", "attribute"});
    std::string d = p[0] ? py_str(*p[0]) : "";
    std::vector<Value> items = as_items(v);
    std::vector<Value> parts;
    if (p.has(1)) {
      std::vector<Value> path = attr_parts(*p[1]);
      for (auto& it : items) it = lookup_path(it, path, nullptr);
    }
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += d;
      out += py_str(items[k]);
    }
    return Value::string(std::move(out));
  }
  if (n == "first" || n == "last") {
    P({});
    if (n == "last" && v.is_generator()) fail("'%s' object is not reversible", type_name(v));
    std::vector<Value> items = as_items(v);
    if (items.empty())
      return Value::undefined(n == "first" ? "No first item, sequence was empty."
                                           : "No last item, sequence was empty.");
    return n == "first" ? items.front() : items.back();
  }
  if (n == "list") {
    P({});
    return to_list(as_items(v));
  }
  if (n == "items") {
    P({});
    if (v.is_undefined()) return to_gen({});
    if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& kv : v.dict->items)
      out.push_back(Value::new_list({kv.first, kv.second}, true));
    return to_gen(std::move(out));
  }
  if (n == "dictsort") {
    Params p = P({"case_sensitive", "by", "reverse"});
    const bool cs = p.has(0) && truthy(*p[0]);
    const std::string by = p.has(1) ? py_str(*p[1]) : "key";
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    if (!v.is_dict()) fail("'%s' object has no attribute 'items'", type_name(v));
    std::vector<Value> pairs;
    for (const auto& kv : v.dict->items)
      pairs.push_back(Value::new_list({kv.first, kv.second}, true));
    const size_t pos = by == "key" ? 0 : 1;
    return to_list(sorted_values(
        std::move(pairs), [&](const Value& it) { return ignore_case(it.list->items[pos], cs); },
        p.has(2) && truthy(*p[2])));
  }
  if (n == "sort") {
    Params p = P({"reverse", "case_sensitive", "attribute"});
    const bool cs = p.has(1) && truthy(*p[1]);
    std::vector<std::vector<Value>> paths;
    if (p.has(2)) {
      if (p[2]->is_string())
        for (const auto& part : str::split(p[2]->s, &kComma, -1))
          paths.push_back(attr_parts(Value::string(part)));
      else
        paths.push_back(attr_parts(*p[2]));
    }
    auto key = [&](const Value& it) {
      if (paths.empty()) return Value::new_list({ignore_case(it, cs)});
      std::vector<Value> ks;
      for (const auto& path : paths) ks.push_back(ignore_case(lookup_path(it, path, nullptr), cs));
      return Value::new_list(std::move(ks));
    };
    return to_list(sorted_values(as_items(v), key, p.has(0) && truthy(*p[0])));
  }
  if (n == "unique") {
    Params p = P({"case_sensitive", "attribute"});
    const bool cs = p.has(0) && truthy(*p[0]);
    std::vector<Value> path = p.has(1) ? attr_parts(*p[1]) : std::vector<Value>{};
    std::vector<Value> seen, out;
    for (auto& it : as_items(v)) {
      Value k = ignore_case(path.empty() ? it : lookup_path(it, path, nullptr), cs);
      if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); }))
        continue;
      seen.push_back(k);
      out.push_back(it);
    }
    return to_gen(std::move(out));
  }
  if (n == "min" || n == "max") {
    Params p = P({"case_sensitive", "attribute"});
    const bool cs = p.has(0) && truthy(*p[0]);
    std::vector<Value> path = p.has(1) ? attr_parts(*p[1]) : std::vector<Value>{};
    std::vector<Value> items = as_items(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    size_t best = 0;
    Value best_key =
        ignore_case(path.empty() ? items[0] : lookup_path(items[0], path, nullptr), cs);
    for (size_t k = 1; k < items.size(); ++k) {
      Value key = ignore_case(path.empty() ? items[k] : lookup_path(items[k], path, nullptr), cs);
      if (n == "min" ? py_less(key, best_key) : py_less(best_key, key)) {
        best = k;
        best_key = key;
      }
    }
    return items[best];
  }
  if (n == "sum") {
    Params p = P({"attribute", "start"});
    Value total = p[1] ? *p[1] : Value::integer(0);
    std::vector<Value> path = p.has(0) ? attr_parts(*p[0]) : std::vector<Value>{};
    for (const auto& it : as_items(v))
      total = binary_op("+", total, path.empty() ? it : lookup_path(it, path, nullptr));
    return total;
  }
  if (n == "map") {
    std::vector<Value> items = v.is_undefined() || !truthy(v) ? std::vector<Value>{} : as_items(v);
    std::vector<Value> out;
    if (a.pos.empty() && a.kwarg("attribute")) {
      const Value* dflt = a.kwarg("default");
      for (const auto& kv : a.kw)
        if (kv.first != "attribute" && kv.first != "default")
          fail("Unexpected keyword argument '%s'", kv.first.c_str());
      std::vector<Value> path = attr_parts(*a.kwarg("attribute"));
      for (const auto& it : items)
        out.push_back(lookup_path(it, path, dflt && !dflt->is_none() ? dflt : nullptr));
      return to_gen(std::move(out));
    }
    if (a.pos.empty()) fail("map requires a filter argument");
    const std::string fname = str_arg(a.pos[0], "filter name");
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const auto& it : items) {
      CallArgs copy = rest;
      out.push_back(in.apply_filter(fname, it, copy));
    }
    return to_gen(std::move(out));
  }
  if (n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") {
    const bool attr = n == "selectattr" || n == "rejectattr";
    const bool keep_true = n == "select" || n == "selectattr";
    std::vector<Value> items = !truthy(v) ? std::vector<Value>{} : as_items(v);
    size_t off = 0;
    std::vector<Value> path;
    if (attr) {
      if (a.pos.empty()) fail("Missing parameter for attribute name");
      path = attr_parts(a.pos[0]);
      off = 1;
    }
    std::string test;
    CallArgs rest;
    if (a.pos.size() > off) {
      test = str_arg(a.pos[off], "test name");
      rest.pos.assign(a.pos.begin() + long(off) + 1, a.pos.end());
      rest.kw = a.kw;
    }
    std::vector<Value> out;
    for (const auto& it : items) {
      Value x = attr ? lookup_path(it, path, nullptr) : it;
      bool r;
      if (test.empty()) {
        r = truthy(x);
      } else {
        CallArgs copy = rest;
        r = in.apply_test(test, x, copy);
      }
      if (r == keep_true) out.push_back(it);
    }
    return to_gen(std::move(out));
  }
  if (n == "attr") {
    Params p = P({"name"});
    if (!p[0]) fail("attr filter needs a name");
    const std::string& an = str_arg(*p[0], "attribute name");
    if (v.is_undefined()) undefined_error(v);
    if (v.kind == Kind::Object) {
      Value out;
      if (v.obj->get_attr(an, out)) return out;
      return Value::undefined("no attribute " + an);
    }
    Value m;
    if (find_method(v, an, m)) return m;
    return Value::undefined("'" + std::string(type_name(v)) + " object' has no attribute '" + an +
                            "'");
  }
  if (n == "reverse") {
    P({});
    if (v.is_string()) {
      std::vector<uint32_t> cps = str::to_cps(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(str::from_cps(cps), v.safe);
    }
    const bool was_generator = v.is_generator();
    std::vector<Value> items = as_items(v);
    std::reverse(items.begin(), items.end());
    if (was_generator) return to_list(std::move(items));  // reversed() fails; list(value) used
    return to_gen(std::move(items),
                  v.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator");
  }
  if (n == "int") {
    Params p = P({"default", "base"});
    const Value dflt = p[0] ? *p[0] : Value::integer(0);
    const int base = p.has(1) ? int(int_arg(*p[1], "base")) : 10;
    if (v.is_undefined()) undefined_error(v);
    if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::integer(v.as_int());
    if (v.kind == Kind::Float) {
      if (!std::isfinite(v.f)) return dflt;
      return Value::integer(int64_t(std::trunc(v.f)));
    }
    if (v.is_string()) {
      int64_t r;
      if (parse_int(v.s, base, r)) return Value::integer(r);
      double d;
      if (parse_float(v.s, d) && std::isfinite(d)) return Value::integer(int64_t(std::trunc(d)));
    }
    return dflt;
  }
  if (n == "float") {
    Params p = P({"default"});
    const Value dflt = p[0] ? *p[0] : Value::number(0.0);
    if (v.is_undefined()) undefined_error(v);
    if (v.is_number()) return Value::number(v.as_double());
    double d;
    if (v.is_string() && parse_float(v.s, d)) return Value::number(d);
    return dflt;
  }
  if (n == "round") {
    Params p = P({"precision", "method"});
    const int64_t prec = p.has(0) ? int_arg(*p[0], "precision") : 0;
    const std::string method = p.has(1) ? py_str(*p[1]) : "common";
    if (method != "common" && method != "ceil" && method != "floor")
      fail("method must be common, ceil or floor");
    if (!v.is_number()) fail("type %s doesn't define __round__ method", type_name(v));
    if (method == "common") {
      if (v.kind != Kind::Float && prec >= 0) return Value::integer(v.as_int());
      if (v.kind != Kind::Float && prec > -19) {
        // int.__round__ with negative digits: round half to even, stays int.
        int64_t p = 1;
        for (int64_t k = 0; k < -prec; ++k) p *= 10;
        int64_t x = v.as_int(), q = x / p, r = x % p;
        if (r < 0) {
          r += p;
          --q;
        }
        if (2 * r > p || (2 * r == p && (q & 1))) ++q;
        return Value::integer(q * p);
      }
      return Value::number(py_round(v.as_double(), prec));
    }
    const double scale = std::pow(10.0, double(prec));
    const double x = v.as_double() * scale;
    return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (n == "abs") {
    P({});
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Kind::Int || v.kind == Kind::Bool) return Value::integer(std::llabs(v.as_int()));
    fail("bad operand type for abs(): '%s'", type_name(v));
  }
  if (n == "indent") {
    Params p = P({"width", "first", "blank"});
    if (v.is_undefined()) undefined_error(v);
    if (!v.is_string())
      fail(v.is_list() ? "'%s' object has no attribute 'splitlines'"
                       : "unsupported operand type(s) for +=: '%s' and 'str'",
           type_name(v));
    Value s = v;
    return Value::string(do_indent(s.s, p.has(0) ? *p[0] : Value::integer(4),
                                   p.has(1) && truthy(*p[1]), p.has(2) && truthy(*p[2])),
                         s.safe);
  }
  if (n == "center") {
    Params p = P({"width"});
    std::string s = py_str(v);
    const int64_t w = p.has(0) ? int_arg(*p[0], "width") : 80;
    const int64_t len = int64_t(str::length(s));
    if (w <= len) return Value::string(s);
    const int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
    return Value::string(std::string(size_t(left), ' ') + s +
                         std::string(size_t(marg - left), ' '));
  }
  if (n == "wordcount") {
    P({});
    std::string s = py_str(v);
    int64_t words = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
      uint32_t c = str::decode(s, i);
      bool w = c == '_' || str::is_digit(c) || str::is_alpha(c) || c >= 0x80;
      if (w && !in_word) ++words;
      in_word = w;
    }
    return Value::integer(words);
  }
  if (n == "batch") {
    Params p = P({"linecount", "fill_with"});
    if (!p[0]) fail("batch needs a line count");
    const int64_t cnt = int_arg(*p[0], "linecount");
    if (cnt <= 0) fail("batch size must be positive");
    std::vector<Value> out, cur;
    for (auto& it : as_items(v)) {
      cur.push_back(it);
      if (int64_t(cur.size()) == cnt) {
        out.push_back(to_list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (p[1])
        while (int64_t(cur.size()) < cnt) cur.push_back(*p[1]);
      out.push_back(to_list(std::move(cur)));
    }
    return to_gen(std::move(out));
  }
  if (n == "format") {
    if (!a.pos.empty() && !a.kw.empty())
      fail("can't handle positional and keyword arguments at the same time");
    return Value::string(percent_format(py_str(v), a));
  }
  if (n == "truncate") {
    Params p = P({"length", "killwords", "end", "leeway"});
    const std::string s = py_str(v);
    const int64_t len = p.has(0) ? int_arg(*p[0], "length") : 255;
    const std::string end = p.has(2) ? py_str(*p[2]) : "...";
    const int64_t leeway = p.has(3) && !p[3]->is_none() ? int_arg(*p[3], "leeway") : 5;
    const int64_t end_len = int64_t(str::length(end));
    if (len < end_len)
      fail("expected length >= %lld, got %lld", (long long)end_len, (long long)len);
    if (leeway < 0) fail("expected leeway >= 0, got %lld", (long long)leeway);
    std::vector<uint32_t> cps = str::to_cps(s);
    if (int64_t(cps.size()) <= len + leeway) return Value::string(s);
    std::string head = str::from_cps(cps.data(), size_t(len - end_len));
    if (!(p.has(1) && truthy(*p[1]))) {
      size_t sp = head.rfind(' ');
      if (sp != std::string::npos) head.resize(sp);
    }
    return Value::string(head + end);
  }
  if (n == "slice") {
    Params p = P({"slices", "fill_with"});
    if (!p[0]) fail("slice needs a number of slices");
    const int64_t slices = int_arg(*p[0], "slices");
    std::vector<Value> seq = as_items(v);
    const int64_t length = int64_t(seq.size());
    if (slices <= 0) fail("integer division or modulo by zero");
    const int64_t per = length / slices, extra = length % slices;
    int64_t offset = 0;
    std::vector<Value> out;
    for (int64_t k = 0; k < slices; ++k) {
      const int64_t start = offset + k * per;
      if (k < extra) ++offset;
      const int64_t stop = offset + (k + 1) * per;
      std::vector<Value> part(seq.begin() + start, seq.begin() + stop);
      if (p[1] && !p[1]->is_none() && k >= extra) part.push_back(*p[1]);
      out.push_back(to_list(std::move(part)));
    }
    return to_gen(std::move(out));
  }
  if (n == "urlencode") {
    P({});
    auto quote = [](const std::string& s, bool for_qs) {
      static const char* hex = "0123456789ABCDEF";
      std::string out;
      for (unsigned char c : s) {
        if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' ||
            (!for_qs && c == '/')) {
          out.push_back(char(c));
        } else if (for_qs && c == ' ') {
          out.push_back('+');
        } else {
          out.push_back('%');
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 15]);
        }
      }
      return out;
    };
    if (v.is_string() || !(v.kind == Kind::List || v.is_dict()))
      return Value::string(quote(py_str(v), false));
    std::string out;
    std::vector<Value> pairs;
    if (v.is_dict())
      for (const auto& kv : v.dict->items)
        pairs.push_back(Value::new_list({kv.first, kv.second}, true));
    else
      pairs = as_items(v);
    for (size_t k = 0; k < pairs.size(); ++k) {
      std::vector<Value> kv = iterate(pairs[k]);
      if (kv.size() != 2) fail("too many values to unpack (expected 2)");
      if (k) out += "&";
      out += quote(py_str(kv[0]), true) + "=" + quote(py_str(kv[1]), true);
    }
    return Value::string(out);
  }
  if (n == "pprint") {
    P({});
    return Value::string(py_repr(v));
  }
  if (is_known_filter(n))
    fail("the '%s' filter is not supported by this template engine", n.c_str());
  fail("No filter named '%s'.", n.c_str());
}

}  // namespace tandem::jinja
