#include "text/jinja/ops.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "text/jinja/pyfmt.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

namespace {

constexpr size_t kMaxBuilt = size_t(256) << 20;  // cap on strings/lists built by * and +

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return std::string(type_name(v)) + " object";
}

bool both_int(const Value& a, const Value& b) {
  return (a.kind == Kind::Int || a.kind == Kind::Bool) &&
         (b.kind == Kind::Int || b.kind == Kind::Bool);
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(a), type_name(b));
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (seq.s.size() * size_t(n) > kMaxBuilt) fail("string repetition result too large");
    std::string out;
    out.reserve(seq.s.size() * size_t(n));
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(std::move(out), seq.safe);
  }
  if (seq.list->items.size() * size_t(n) > kMaxBuilt / 64) fail("list repetition result too large");
  std::vector<Value> items;
  for (int64_t k = 0; k < n; ++k)
    items.insert(items.end(), seq.list->items.begin(), seq.list->items.end());
  return Value::new_list(std::move(items), seq.list->tuple);
}

// Python index normalization for sequences of length n.
bool norm_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

}  // namespace

std::string undefined_message(const Value& u) {
  return u.s.empty() ? "value is undefined" : u.s;
}

void undefined_error(const Value& u) {
  throw tandem::Error(undefined_message(u));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const char c0 = op[0];
  if (op == "+") {
    if (a.is_number() && b.is_number()) {
      if (both_int(a, b)) {
        int64_t r;
        if (!__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
        return Value::number(double(a.as_int()) + double(b.as_int()));
      }
      return Value::number(a.as_double() + b.as_double());
    }
    if (a.is_string() && b.is_string()) {
      if (a.s.size() + b.s.size() > kMaxBuilt) fail("string too large");
      // Markup + str escapes the plain side (markupsafe semantics).
      if (a.safe && !b.safe) return Value::string(a.s + str::html_escape(b.s), true);
      if (b.safe && !a.safe) return Value::string(str::html_escape(a.s) + b.s, true);
      return Value::string(a.s + b.s, a.safe && b.safe);
    }
    if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
      std::vector<Value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return Value::new_list(std::move(items), a.list->tuple);
    }
    if (a.is_string()) fail("can only concatenate str (not \"%s\") to str", type_name(b));
    if (a.is_list())
      fail("can only concatenate %s (not \"%s\") to %s", type_name(a), type_name(b), type_name(a));
    unsupported("+", a, b);
  }
  if (op == "*") {
    if (a.is_number() && b.is_number()) {
      if (both_int(a, b)) {
        int64_t r;
        if (!__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
        return Value::number(double(a.as_int()) * double(b.as_int()));
      }
      return Value::number(a.as_double() * b.as_double());
    }
    if ((a.is_string() || a.is_list()) && (b.kind == Kind::Int || b.kind == Kind::Bool))
      return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.kind == Kind::Int || a.kind == Kind::Bool))
      return repeat(b, a.as_int());
    if (a.is_string() || b.is_string() || a.is_list() || b.is_list())
      fail("can't multiply sequence by non-int of type '%s'",
           type_name(a.is_string() || a.is_list() ? b : a));
    unsupported("*", a, b);
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is_string()) {
      CallArgs args;
      if (b.is_list() && b.list->tuple)
        args.pos = b.list->items;
      else if (b.is_dict())
        for (const auto& kv : b.dict->items) args.kw.emplace_back(py_str(kv.first), kv.second);
      else
        args.pos.push_back(b);
      return Value::string(percent_format(a.s, args));
    }
    unsupported(op == "**" ? "** or pow()" : op.c_str(), a, b);
  }
  if (op == "-") {
    if (both_int(a, b)) {
      int64_t r;
      if (!__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Value::integer(r);
      return Value::number(double(a.as_int()) - double(b.as_int()));
    }
    return Value::number(a.as_double() - b.as_double());
  }
  if (op == "/") {
    if (b.as_double() == 0) fail("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || c0 == '%') {
    const bool is_div = op == "//";
    if (both_int(a, b)) {
      if (b.as_int() == 0)
        fail(is_div ? "integer division or modulo by zero" : "integer modulo by zero");
      if (a.as_int() == INT64_MIN && b.as_int() == -1)
        return is_div ? Value::number(9.2233720368547758e18) : Value::integer(0);
      return Value::integer(is_div ? floor_div(a.as_int(), b.as_int())
                                   : floor_mod(a.as_int(), b.as_int()));
    }
    const double x = a.as_double(), y = b.as_double();
    if (y == 0) fail(is_div ? "float floor division by zero" : "float modulo");
    // Python's float divmod.
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    if (!is_div) return Value::number(mod);
    double fdiv;
    if (div != 0) {
      fdiv = std::floor(div);
      if (div - fdiv > 0.5) fdiv += 1.0;
    } else {
      fdiv = std::copysign(0.0, x / y);
    }
    return Value::number(fdiv);
  }
  if (op == "**") {
    if (both_int(a, b) && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), r = 1;
      bool overflow = false;
      while (e > 0 && !overflow) {
        if (e & 1) overflow |= __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e > 0) overflow |= __builtin_mul_overflow(base, base, &base);
      }
      if (!overflow) return Value::integer(r);
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
    const double r = std::pow(a.as_double(), b.as_double());
    if (std::isinf(r) && std::isfinite(a.as_double()) && std::isfinite(b.as_double()))
      fail("(34, 'Numerical result out of range')");
    return Value::number(r);
  }
  fail("unknown operator %s", op.c_str());
}

Value negate(const Value& v) {
  if (v.is_undefined()) undefined_error(v);
  if (v.kind == Kind::Float) return Value::number(-v.f);
  if (v.kind == Kind::Int || v.kind == Kind::Bool) {
    if (v.as_int() == INT64_MIN) return Value::number(9.2233720368547758e18);
    return Value::integer(-v.as_int());
  }
  fail("bad operand type for unary -: '%s'", type_name(v));
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (both_int(a, b)) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;
  if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
    const auto &x = a.list->items, &y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals(x[k], y[k])) continue;
      return py_less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return !py_less(b, a);
  if (op == ">=") return !py_less(a, b);
  fail("unknown comparison %s", op.c_str());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::String:
      if (!item.is_string())
        fail("'in <string>' requires string as left operand, not %s", type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Kind::List:
      for (const auto& v : iterate(container))
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict: return container.dict->find(item) != nullptr;
    case Kind::Undefined: return false;
    default: fail("argument of type '%s' is not iterable", type_name(container));
  }
}

Value getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  Value m;
  if (find_method(obj, name, m)) return m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(Value::string(name))) return *v;
  }
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

Value getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_generator())
    return Value::undefined("'" + object_type_repr(obj) + "' has no attribute " + py_repr(key));
  switch (obj.kind) {
    case Kind::Dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      break;
    case Kind::List:
      if (key.kind == Kind::Int || key.kind == Kind::Bool) {
        int64_t i = key.as_int();
        if (norm_index(i, int64_t(obj.list->items.size()))) return obj.list->items[size_t(i)];
      }
      break;
    case Kind::String:
      if (key.kind == Kind::Int || key.kind == Kind::Bool) {
        int64_t i = key.as_int();
        if (str::is_ascii(obj.s)) {
          if (norm_index(i, int64_t(obj.s.size())))
            return Value::string(obj.s.substr(size_t(i), 1));
        } else {
          std::vector<uint32_t> cps = str::to_cps(obj.s);
          if (norm_index(i, int64_t(cps.size())))
            return Value::string(str::from_cps(&cps[size_t(i)], 1));
        }
      }
      break;
    default: break;
  }
  if (key.is_string()) {
    Value m;
    if (find_method(obj, key.s, m)) return m;
    return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + key.s + "'");
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + py_repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_generator()) return Value::undefined("'generator' object is not subscriptable");
  auto as_opt = [](const Value& v, const char* what) -> std::pair<bool, int64_t> {
    if (v.is_none() || v.is_undefined()) return {false, 0};
    if (v.kind != Kind::Int && v.kind != Kind::Bool)
      fail("slice indices must be integers or None or have an __index__ method");
    return {true, v.as_int()};
  };
  const auto step_opt = as_opt(step, "step");
  const int64_t st = step_opt.first ? step_opt.second : 1;
  if (st == 0) fail("slice step cannot be zero");
  const auto start_opt = as_opt(start, "start");
  const auto stop_opt = as_opt(stop, "stop");
  const bool has_a = start_opt.first, has_b = stop_opt.first;
  const int64_t a = start_opt.second, b = stop_opt.second;
  int64_t n;
  std::vector<uint32_t> cps;
  const bool ascii = obj.is_string() && str::is_ascii(obj.s);
  if (obj.is_string()) {
    if (!ascii) cps = str::to_cps(obj.s);
    n = ascii ? int64_t(obj.s.size()) : int64_t(cps.size());
  } else if (obj.is_list()) {
    n = int64_t(obj.list->items.size());
  } else {
    fail("'%s' object is not subscriptable", type_name(obj));
  }
  auto adjust = [&](bool has, int64_t v, int64_t dflt_pos, int64_t dflt_neg) {
    if (!has) return st > 0 ? dflt_pos : dflt_neg;
    if (v < 0) {
      v += n;
      if (v < 0) v = st > 0 ? 0 : -1;
    } else if (v >= n) {
      v = st > 0 ? n : n - 1;
    }
    return v;
  };
  const int64_t lo = adjust(has_a, a, 0, n - 1);
  const int64_t hi = adjust(has_b, b, n, -1);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t k = lo; k < hi; k += st) idx.push_back(k);
  else
    for (int64_t k = lo; k > hi; k += st) idx.push_back(k);
  if (obj.is_string()) {
    std::string out;
    for (int64_t k : idx) {
      if (ascii)
        out.push_back(obj.s[size_t(k)]);
      else
        str::append_utf8(out, cps[size_t(k)]);
    }
    return Value::string(std::move(out), obj.safe);
  }
  std::vector<Value> items;
  items.reserve(idx.size());
  for (int64_t k : idx) items.push_back(obj.list->items[size_t(k)]);
  return Value::new_list(std::move(items), obj.list->tuple);
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::List:
      if (v.list->gen_type) {
        if (!v.list->deferred_error.empty()) fail("%s", v.list->deferred_error.c_str());
        if (v.list->consumed) return {};
        v.list->consumed = true;
      }
      return v.list->items;
    case Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.s.size();) {
        size_t j = i;
        str::decode(v.s, j);
        chars.push_back(Value::string(v.s.substr(i, j - i)));
        i = j;
      }
      return chars;
    }
    case Kind::Undefined: return {};
    default: fail("'%s' object is not iterable", type_name(v));
  }
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::String: return int64_t(str::length(v.s));
    case Kind::List:
      if (v.list->gen_type) fail("object of type '%s' has no len()", v.list->gen_type);
      return int64_t(v.list->items.size());
    case Kind::Dict: return int64_t(v.dict->items.size());
    case Kind::Undefined: return 0;
    default: fail("object of type '%s' has no len()", type_name(v));
  }
}

}  // namespace tandem::jinja
