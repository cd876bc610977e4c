// Global functions of the environment transformers renders with: Jinja's
// range/namespace/dict/joiner/cycler and transformers' raise_exception and
// strftime_now.
#include <ctime>

#include "text/jinja/args.h"
#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/ops.h"
#include "text/jinja/pyfmt.h"

namespace tandem::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

struct NamespaceObj : Object {
  DictObj attrs;
  const char* type_name() const override { return "Namespace"; }
  bool get_attr(std::string_view name, Value& out) override {
    const Value* v = attrs.find(Value::string(std::string(name)));
    if (!v) return false;
    out = *v;
    return true;
  }
  bool set_attr(std::string_view name, const Value& v) override {
    attrs.set(Value::string(std::string(name)), v);
    return true;
  }
  std::string repr() const override {
    Value d = Value::new_dict();
    d.dict->items = attrs.items;
    return "<Namespace " + py_repr(d) + ">";
  }
};

Value range_fn(Interpreter&, CallArgs& a) {
  if (!a.kw.empty()) fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    fail("range expected at least 1 argument, got %zu", a.pos.size());
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = int_arg(a.pos[0], "range");
  } else {
    start = int_arg(a.pos[0], "range");
    stop = int_arg(a.pos[1], "range");
    if (a.pos.size() == 3) step = int_arg(a.pos[2], "range");
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  int64_t n = 0;
  if (step > 0 && start < stop) n = (stop - start + step - 1) / step;
  if (step < 0 && start > stop) n = (start - stop - step - 1) / -step;
  if (n > kMaxRange)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (%lld).",
         (long long)kMaxRange);
  std::vector<Value> items;
  items.reserve(size_t(n));
  for (int64_t k = 0; k < n; ++k) items.push_back(Value::integer(start + k * step));
  return Value::new_list(std::move(items));
}

Value namespace_fn(Interpreter&, CallArgs& a) {
  auto ns = std::make_shared<NamespaceObj>();
  if (a.pos.size() > 1) fail("namespace() takes at most 1 positional argument");
  if (a.pos.size() == 1) {
    const Value& init = a.pos[0];
    if (init.is_dict()) {
      for (const auto& kv : init.dict->items) ns->attrs.set(kv.first, kv.second);
    } else {
      for (const auto& pair : iterate(init)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has wrong length");
        ns->attrs.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& kv : a.kw) ns->attrs.set(Value::string(kv.first), kv.second);
  return Value::object(ns);
}

Value dict_fn(Interpreter&, CallArgs& a) {
  Value d = Value::new_dict();
  if (a.pos.size() > 1) fail("dict expected at most 1 argument, got %zu", a.pos.size());
  if (a.pos.size() == 1) {
    if (a.pos[0].is_dict()) {
      d.dict->items = a.pos[0].dict->items;
    } else {
      for (const auto& pair : iterate(a.pos[0])) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has wrong length");
        d.dict->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& kv : a.kw) d.dict->set(Value::string(kv.first), kv.second);
  return d;
}

Value raise_exception_fn(Interpreter& in, CallArgs& a) {
  Params p(a, {"message"}, "raise_exception");
  if (!p[0]) fail("raise_exception() missing 1 required positional argument: 'message'");
  throw TemplateError(py_str(*p[0]), in.line());
}

Value strftime_now_fn(Interpreter& in, CallArgs& a) {
  Params p(a, {"format"}, "strftime_now");
  if (!p[0]) fail("strftime_now() missing 1 required positional argument: 'format'");
  const std::string& fmt = str_arg(*p[0], "format");
  std::tm tm = in.now();
  std::string out;
  // strftime has no way to tell "empty result" from "buffer too small".
  for (size_t cap = 64; cap <= (size_t(1) << 20); cap *= 4) {
    std::string buf(cap, '\0');
    size_t n = std::strftime(buf.data(), cap, (fmt + "\x01").c_str(), &tm);
    if (n > 0) {
      buf.resize(n - 1);
      return Value::string(buf);
    }
  }
  fail("strftime_now(): result too long");
}

struct Joiner : Object {
  std::string sep;
  bool used = false;
  const char* type_name() const override { return "Joiner"; }
  bool get_attr(std::string_view, Value&) override { return false; }
};

Value joiner_fn(Interpreter&, CallArgs& a) {
  Params p(a, {"sep"}, "joiner");
  auto state = std::make_shared<Joiner>();
  state->sep = p[0] ? py_str(*p[0]) : ", ";
  return Value::function("joiner", [state](Interpreter&, CallArgs&) {
    if (!state->used) {
      state->used = true;
      return Value::string("");
    }
    return Value::string(state->sep);
  });
}

}  // namespace

void install_globals(Scope& root) {
  root.vars["range"] = Value::function("range", range_fn);
  root.vars["namespace"] = Value::function("namespace", namespace_fn);
  root.vars["dict"] = Value::function("dict", dict_fn);
  root.vars["raise_exception"] = Value::function("raise_exception", raise_exception_fn);
  root.vars["strftime_now"] = Value::function("strftime_now", strftime_now_fn);
  root.vars["joiner"] = Value::function("joiner", joiner_fn);
}

}  // namespace tandem::jinja
