// Jinja's tests (`x is defined`, `x is string`, ...), from jinja2/tests.py.
#include <cmath>

#include "text/jinja/args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/ops.h"
#include "text/jinja/parser.h"
#include "text/jinja/strutil.h"

namespace tandem::jinja {

namespace {

const Value& arg1(const CallArgs& a, const std::string& name) {
  Params p(a, {"other"}, name);
  if (!p[0]) fail("%s() missing 1 required positional argument", name.c_str());
  return *p[0];
}

bool same_object(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::None:
    case Kind::Undefined: return true;
    case Kind::Bool: return a.b == b.b;
    case Kind::Int: return a.i == b.i && a.i >= -5 && a.i <= 256;  // CPython's small ints
    case Kind::String: return a.s == b.s;
    case Kind::List: return a.list == b.list;
    case Kind::Dict: return a.dict == b.dict;
    case Kind::Object: return a.obj == b.obj;
    case Kind::Func: return a.fn == b.fn;
    default: return false;
  }
}

}  // namespace

bool builtin_test(Interpreter& in, const std::string& n, const Value& v, CallArgs& a) {
  (void)in;
  auto none_args = [&] { Params p(a, {}, n); };
  if (n == "defined") return none_args(), !v.is_undefined();
  if (n == "undefined") return none_args(), v.is_undefined();
  if (n == "none") return none_args(), v.is_none();
  if (n == "boolean") return none_args(), v.kind == Kind::Bool;
  if (n == "true") return none_args(), v.kind == Kind::Bool && v.b;
  if (n == "false") return none_args(), v.kind == Kind::Bool && !v.b;
  if (n == "integer") return none_args(), v.kind == Kind::Int;
  if (n == "float") return none_args(), v.kind == Kind::Float;
  if (n == "number") return none_args(), v.is_number();
  if (n == "string") return none_args(), v.is_string();
  if (n == "mapping") return none_args(), v.is_dict();
  if (n == "iterable")
    return none_args(), v.is_string() || v.kind == Kind::List || v.is_dict() || v.is_undefined();
  if (n == "sequence")
    return none_args(), v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (n == "callable")  // Undefined has __call__ (it raises), so Python calls it callable
    return none_args(), v.kind == Kind::Func || v.is_undefined();
  if (n == "escaped") return none_args(), v.is_string() && v.safe;
  if (n == "lower" || n == "upper") {
    none_args();
    std::string s = py_str(v);
    bool any = false;
    for (size_t i = 0; i < s.size();) {
      uint32_t c = str::decode(s, i);
      const bool up = str::to_lower(c) != c, low = str::to_upper(c) != c;
      if (n == "lower" ? up : low) return false;
      any |= n == "lower" ? low : up;
    }
    return any;
  }
  if (n == "odd" || n == "even") {
    none_args();
    // value % 2 == 1 (or == 0), with Python's modulo.
    return equals(binary_op("%", v, Value::integer(2)), Value::integer(n == "odd" ? 1 : 0));
  }
  if (n == "divisibleby") {
    Params p(a, {"num"}, n);
    if (!p[0]) fail("divisibleby() missing 1 required positional argument: 'num'");
    if (p[0]->is_number() && p[0]->kind != Kind::Float && p[0]->as_int() == 0)
      fail("integer modulo by zero");
    Value r = binary_op("%", v, *p[0]);
    return equals(r, Value::integer(0));
  }
  if (n == "sameas") return same_object(v, arg1(a, n));
  if (n == "in") return contains(arg1(a, n), v);
  if (n == "==" || n == "eq" || n == "equalto") return equals(v, arg1(a, n));
  if (n == "!=" || n == "ne") return !equals(v, arg1(a, n));
  if (n == ">" || n == "gt" || n == "greaterthan") return compare(">", v, arg1(a, n));
  if (n == ">=" || n == "ge") return compare(">=", v, arg1(a, n));
  if (n == "<" || n == "lt" || n == "lessthan") return compare("<", v, arg1(a, n));
  if (n == "<=" || n == "le") return compare("<=", v, arg1(a, n));
  if (n == "filter") return none_args(), v.is_string() && is_known_filter(v.s);
  if (n == "test") return none_args(), v.is_string() && is_known_test(v.s);
  fail("No test named '%s'.", n.c_str());
}

}  // namespace tandem::jinja
