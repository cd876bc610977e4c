#include "text/jinja/interpreter.h"

#include <exception>

#include "text/jinja/builtins.h"
#include "text/jinja/error.h"
#include "text/jinja/ops.h"
#include "text/jinja/pyfmt.h"

namespace tandem::jinja {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

LineGuard::LineGuard(Interpreter& i, int line)
    : in(i), saved(i.line_), exceptions(std::uncaught_exceptions()) {
  in.line_ = line;
}
LineGuard::~LineGuard() {
  if (std::uncaught_exceptions() == exceptions) in.line_ = saved;
}

// The `loop` variable of a for loop.
struct LoopObj : Object {
  std::vector<Value> items;
  Value recurse;  // set for `recursive` loops
  int64_t index0 = 0;
  int depth0 = 0;
  std::vector<Value> last_changed;
  bool changed_called = false;

  const char* type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items.size()) + ">";
  }
  bool get_attr(std::string_view name, Value& out) override {
    const int64_t n = int64_t(items.size());
    if (name == "index")
      out = Value::integer(index0 + 1);
    else if (name == "index0")
      out = Value::integer(index0);
    else if (name == "revindex")
      out = Value::integer(n - index0);
    else if (name == "revindex0")
      out = Value::integer(n - index0 - 1);
    else if (name == "first")
      out = Value::boolean(index0 == 0);
    else if (name == "last")
      out = Value::boolean(index0 == n - 1);
    else if (name == "length")
      out = Value::integer(n);
    else if (name == "depth")
      out = Value::integer(depth0 + 1);
    else if (name == "depth0")
      out = Value::integer(depth0);
    else if (name == "previtem")
      out = index0 > 0 ? items[size_t(index0 - 1)] : Value::undefined("there is no previous item");
    else if (name == "nextitem")
      out = index0 + 1 < n ? items[size_t(index0 + 1)] : Value::undefined("there is no next item");
    else if (name == "cycle") {
      const int64_t i0 = index0;
      out = Value::function("cycle", [i0](Interpreter&, CallArgs& a) {
        if (a.pos.empty()) fail("no items for cycling given");
        return a.pos[size_t(i0 % int64_t(a.pos.size()))];
      });
    } else if (name == "changed") {
      LoopObj* self = this;
      out = Value::function("changed", [self](Interpreter&, CallArgs& a) {
        bool same = self->changed_called && self->last_changed.size() == a.pos.size();
        for (size_t k = 0; same && k < a.pos.size(); ++k)
          same = equals(self->last_changed[k], a.pos[k]);
        self->changed_called = true;
        self->last_changed = a.pos;
        return Value::boolean(!same);
      });
    } else if (name == "__call__") {
      if (recurse.kind != Kind::Func)
        fail("The loop must have the 'recursive' marker to be called recursively.");
      out = recurse;
    } else {
      return false;
    }
    return true;
  }
};

Interpreter::Interpreter(const TemplateAst& ast, RenderLimits limits, Clock clock)
    : ast_(ast), limits_(limits), clock_(std::move(clock)) {}

void Interpreter::fail(const std::string& msg) const {
  throw TemplateError(msg, line_);
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps)
    fail("template exceeded its evaluation budget (" + std::to_string(limits_.max_steps) +
         " steps); is it looping without end?");
}

void Interpreter::emit(const std::string& s) {
  if (out_->size() + s.size() > limits_.max_output_bytes)
    fail("rendered output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  out_->append(s);
}

std::string Interpreter::render(const std::vector<std::pair<std::string, Value>>& vars) {
  root_ = std::make_shared<Scope>();
  install_globals(*root_);
  for (const auto& kv : vars) root_->vars[kv.first] = kv.second;
  std::string out;
  out_ = &out;
  steps_ = 0;
  depth_ = 0;
  try {
    exec(ast_.body, root_);
  } catch (const TemplateError&) {
    root_.reset();
    throw;
  } catch (const std::exception& e) {
    root_.reset();
    throw TemplateError(e.what(), line_);
  }
  root_.reset();
  return out;
}

Interpreter::Flow Interpreter::exec(const Body& body, const ScopePtr& scope) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interpreter::capture(const Body& body, const ScopePtr& scope) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  struct Restore {
    Interpreter* in;
    std::string* saved;
    ~Restore() { in->out_ = saved; }
  } restore{this, saved};
  exec(body, scope);
  return buf;
}

static ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope) {
  LineGuard g(*this, s.line);
  step();
  switch (s.kind) {
    case SK::Output:
      for (const auto& e : s.exprs) {
        if (e->kind == EK::Const && e->value.is_string()) {
          emit(e->value.s);
          continue;
        }
        Value v = eval(*e, scope);
        emit(v.is_string() ? v.s : py_str(v));
      }
      return Flow::Normal;
    case SK::If:
      if (truthy(eval(*s.test, scope))) return exec(s.body, scope);
      return exec(s.else_body, scope);
    case SK::For: return exec_for(s, scope);
    case SK::Set: assign(*s.target, eval(*s.expr, scope), scope); return Flow::Normal;
    case SK::SetBlock: {
      Value v = Value::string(capture(s.body, child(scope)));
      if (s.filter) v = eval_filter(*s.filter, scope, &v);
      assign(*s.target, v, scope);
      return Flow::Normal;
    }
    case SK::Macro: scope->vars[s.name] = make_macro(s, scope, s.name); return Flow::Normal;
    case SK::CallBlock: {
      Value caller = make_macro(s, scope, "caller");
      Value v = eval_call(*s.expr, scope, &caller);
      emit(v.is_string() ? v.s : py_str(v));
      return Flow::Normal;
    }
    case SK::FilterBlock: {
      Value v = Value::string(capture(s.body, child(scope)));
      v = eval_filter(*s.filter, scope, &v);
      emit(v.is_string() ? v.s : py_str(v));
      return Flow::Normal;
    }
    case SK::With: {
      auto inner = child(scope);
      std::vector<Value> vals;
      for (const auto& e : s.exprs) vals.push_back(eval(*e, scope));
      for (size_t k = 0; k < vals.size(); ++k) assign(*s.targets[k], vals[k], inner);
      return exec(s.body, inner);
    }
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
    case SK::Scope: return exec(s.body, scope);
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, const ScopePtr& scope) {
  Value iterable = eval(*s.expr, scope);
  Flow flow = Flow::Normal;
  std::string text = run_loop(s, scope, iterable, 0, &flow);
  (void)text;
  return Flow::Normal;
}

std::string Interpreter::run_loop(const Stmt& s, const ScopePtr& scope, const Value& iterable,
                                  int depth, Flow* flow_out) {
  std::vector<Value> items = iterate(iterable);
  if (s.test) {
    std::vector<Value> kept;
    for (auto& it : items) {
      auto fs = child(scope);
      assign(*s.target, it, fs);
      if (truthy(eval(*s.test, fs))) kept.push_back(std::move(it));
    }
    items = std::move(kept);
  }
  auto loop = std::make_shared<LoopObj>();
  loop->items = std::move(items);
  loop->depth0 = depth;
  if (s.recursive) {
    // Calling loop(children) renders the body for a nested iterable.
    std::weak_ptr<Scope> weak = scope;
    const Stmt* st = &s;
    loop->recurse = Value::function("loop", [this, weak, st, depth](Interpreter&, CallArgs& a) {
      if (a.pos.size() != 1) fail("loop() takes exactly one argument");
      if (depth_ + 1 > limits_.max_call_depth) this->fail("maximum recursion depth exceeded");
      ScopePtr sc = weak.lock();
      if (!sc) sc = root_;
      ++depth_;
      std::string out;
      std::string* saved = out_;
      out_ = &out;
      struct Restore {
        Interpreter* in;
        std::string* saved;
        ~Restore() {
          in->out_ = saved;
          --in->depth_;
        }
      } restore{this, saved};
      Flow f = Flow::Normal;
      run_loop(*st, sc, a.pos[0], depth + 1, &f);
      return Value::string(std::move(out));
    });
  }
  Value loop_value = Value::object(loop);
  const size_t n = loop->items.size();
  for (size_t k = 0; k < n; ++k) {
    step();
    loop->index0 = int64_t(k);
    auto it_scope = child(scope);
    assign(*s.target, loop->items[k], it_scope);
    it_scope->vars["loop"] = loop_value;
    Flow f = exec(s.body, it_scope);
    if (f == Flow::Break) break;
  }
  if (n == 0) exec(s.else_body, child(scope));
  *flow_out = Flow::Normal;
  return {};
}

void Interpreter::assign(const Expr& target, const Value& v, const ScopePtr& scope) {
  switch (target.kind) {
    case EK::Name: scope->vars[target.name] = v; return;
    case EK::Tuple: {
      std::vector<Value> parts = iterate(v);
      const size_t want = target.items.size();
      if (parts.size() > want)
        fail("too many values to unpack (expected " + std::to_string(want) + ")");
      if (parts.size() < want)
        fail("not enough values to unpack (expected " + std::to_string(want) + ", got " +
             std::to_string(parts.size()) + ")");
      for (size_t k = 0; k < want; ++k) assign(*target.items[k], parts[k], scope);
      return;
    }
    case EK::NSRef: {
      const Value* ns = scope->lookup(target.name);
      if (!ns || ns->kind != Kind::Object || !ns->obj->set_attr(target.attr, v))
        fail("cannot assign attribute on non-namespace object");
      return;
    }
    default: fail("can't assign to this expression");
  }
}

Value Interpreter::make_macro(const Stmt& m, const ScopePtr& scope, const std::string& name) {
  std::weak_ptr<Scope> weak = scope;
  const Stmt* mp = &m;
  Value v = Value::function(name, [this, mp, weak, name](Interpreter&, CallArgs& a) {
    return call_macro(*mp, weak, name, a);
  });
  v.fn->is_macro = true;
  return v;
}

Value Interpreter::call_macro(const Stmt& m, const std::weak_ptr<Scope>& defining,
                              const std::string& name, CallArgs& a) {
  ScopePtr parent = defining.lock();
  if (!parent) parent = root_;
  auto sc = child(parent);
  const size_t np = m.params.size();
  const size_t first_default = np - m.defaults.size();
  if (a.pos.size() > np && !m.uses_varargs)
    fail("macro '" + name + "' takes not more than " + std::to_string(np) + " argument(s)");
  std::vector<bool> given(np, false);
  for (size_t k = 0; k < np && k < a.pos.size(); ++k) {
    sc->vars[m.params[k]] = a.pos[k];
    given[k] = true;
  }
  Value kwargs = Value::new_dict();
  Value caller = Value::undefined("No caller defined");
  for (const auto& kv : a.kw) {
    size_t k = 0;
    while (k < np && m.params[k] != kv.first) ++k;
    if (k < np) {
      if (given[k])
        fail("macro '" + name + "' got multiple values for argument '" + kv.first + "'");
      sc->vars[kv.first] = kv.second;
      given[k] = true;
    } else if (kv.first == "caller" && m.uses_caller) {
      caller = kv.second;
    } else if (m.uses_kwargs) {
      kwargs.dict->set(Value::string(kv.first), kv.second);
    } else {
      fail("macro '" + name + "' takes no keyword argument '" + kv.first + "'");
    }
  }
  if (++depth_ > limits_.max_call_depth) {
    --depth_;
    fail("maximum recursion depth exceeded in macro '" + name + "'");
  }
  struct DepthRestore {
    int& d;
    ~DepthRestore() { --d; }
  } restore{depth_};
  for (size_t k = 0; k < np; ++k) {
    if (given[k]) continue;
    if (k >= first_default)
      sc->vars[m.params[k]] = eval(*m.defaults[k - first_default], sc);
    else
      sc->vars[m.params[k]] = Value::undefined("parameter '" + m.params[k] + "' was not provided");
  }
  if (m.uses_varargs) {
    std::vector<Value> extra;
    for (size_t k = np; k < a.pos.size(); ++k) extra.push_back(a.pos[k]);
    sc->vars["varargs"] = Value::new_list(std::move(extra), true);
  }
  if (m.uses_kwargs) sc->vars["kwargs"] = kwargs;
  if (m.uses_caller) sc->vars["caller"] = caller;
  return Value::string(capture(m.body, sc));
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (callee.kind == Kind::Func) return callee.fn->call(*this, args);
  fail(std::string("'") + type_name(callee) + "' object is not callable");
}

Value Interpreter::apply_filter(const std::string& name, const Value& v, CallArgs& args) {
  return builtin_filter(*this, name, v, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& v, CallArgs& args) {
  return builtin_test(*this, name, v, args);
}

CallArgs Interpreter::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs a;
  for (const auto& it : e.items) a.pos.push_back(eval(*it, scope));
  for (const auto& kv : e.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
  if (e.dyn_args)
    for (auto& v : iterate(eval(*e.dyn_args, scope))) a.pos.push_back(std::move(v));
  if (e.dyn_kwargs) {
    Value d = eval(*e.dyn_kwargs, scope);
    if (!d.is_dict()) fail("argument after ** must be a mapping, not " + std::string(type_name(d)));
    for (const auto& kv : d.dict->items) {
      if (!kv.first.is_string()) fail("keywords must be strings");
      a.kw.emplace_back(kv.first.s, kv.second);
    }
  }
  return a;
}

Value Interpreter::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  Value callee = eval(*e.a, scope);
  CallArgs a = eval_args(e, scope);
  if (caller) a.kw.emplace_back("caller", *caller);
  LineGuard g(*this, e.line);
  if (callee.kind == Kind::Object) {
    // A recursive loop object is called to render a nested level.
    Value fn;
    if (callee.obj->get_attr("__call__", fn)) return call(fn, a);
  }
  return call(callee, a);
}

Value Interpreter::eval_filter(const Expr& e, const ScopePtr& scope, const Value* input) {
  Value base;
  if (!e.a)
    base = *input;
  else if (e.a->kind == EK::Filter && input)
    base = eval_filter(*e.a, scope, input);
  else
    base = eval(*e.a, scope);
  CallArgs a = eval_args(e, scope);
  LineGuard g(*this, e.line);
  return apply_filter(e.name, base, a);
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  LineGuard g(*this, e.line);
  step();
  switch (e.kind) {
    case EK::Const: return e.value;
    case EK::Name: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case EK::NSRef: fail("namespace references can only be assigned to");
    case EK::List:
    case EK::Tuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& it : e.items) items.push_back(eval(*it, scope));
      return Value::new_list(std::move(items), e.kind == EK::Tuple);
    }
    case EK::Dict: {
      Value d = Value::new_dict();
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k], scope);
        if (key.is_list() && !key.list->tuple) fail("unhashable type: 'list'");
        if (key.is_dict()) fail("unhashable type: 'dict'");
        d.dict->set(key, eval(*e.items[k + 1], scope));
      }
      return d;
    }
    case EK::Getattr: {
      Value obj = eval(*e.a, scope);
      if (obj.kind == Kind::Object) {
        Value out;
        if (obj.obj->get_attr(e.name, out)) return out;
        return Value::undefined("'" + std::string(obj.obj->type_name()) +
                                " object' has no attribute '" + e.name + "'");
      }
      return getattr(obj, e.name);
    }
    case EK::Getitem: {
      Value obj = eval(*e.a, scope);
      if (e.b->kind == EK::Slice) {
        const Expr& sl = *e.b;
        Value a = sl.a ? eval(*sl.a, scope) : Value::none();
        Value b = sl.b ? eval(*sl.b, scope) : Value::none();
        Value c = sl.c ? eval(*sl.c, scope) : Value::none();
        return slice(obj, a, b, c);
      }
      Value key = eval(*e.b, scope);
      if (obj.kind == Kind::Object) {
        Value out;
        if (key.is_string() && obj.obj->get_attr(key.s, out)) return out;
        return Value::undefined("'" + std::string(obj.obj->type_name()) +
                                " object' has no attribute '" + py_str(key) + "'");
      }
      return getitem(obj, key);
    }
    case EK::Slice: fail("slice outside of a subscript");
    case EK::Call: return eval_call(e, scope, nullptr);
    case EK::Filter: return eval_filter(e, scope, nullptr);
    case EK::Test: {
      Value v = eval(*e.a, scope);
      CallArgs a = eval_args(e, scope);
      return Value::boolean(apply_test(e.name, v, a));
    }
    case EK::Not: return Value::boolean(!truthy(eval(*e.a, scope)));
    case EK::Neg: return negate(eval(*e.a, scope));
    case EK::Pos: {
      Value v = eval(*e.a, scope);
      if (v.is_undefined()) undefined_error(v);
      if (!v.is_number()) fail(std::string("bad operand type for unary +: '") + type_name(v) + "'");
      if (v.kind == Kind::Bool) return Value::integer(v.as_int());
      return v;
    }
    case EK::Binary: {
      Value a = eval(*e.a, scope);
      Value b = eval(*e.b, scope);
      return binary_op(e.name, a, b);
    }
    case EK::Concat: {
      std::string out;
      for (const auto& it : e.items) {
        Value v = eval(*it, scope);
        out += v.is_string() ? v.s : py_str(v);
      }
      return Value::string(std::move(out));
    }
    case EK::Compare: {
      Value left = eval(*e.items[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.items[k + 1], scope);
        if (!compare(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::And: {
      Value a = eval(*e.a, scope);
      if (!truthy(a)) return a;
      return eval(*e.b, scope);
    }
    case EK::Or: {
      Value a = eval(*e.a, scope);
      if (truthy(a)) return a;
      return eval(*e.b, scope);
    }
    case EK::CondExpr: {
      if (truthy(eval(*e.a, scope))) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value::undefined();
}

}  // namespace tandem::jinja
