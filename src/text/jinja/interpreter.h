// Walks the syntax tree and renders it. Scoping follows Jinja: `if` shares its
// scope, each `for` iteration, macro call, `with` and block capture gets a
// child scope, namespaces carry values out of loops.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace tandem::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

struct RenderLimits {
  size_t max_output_bytes = size_t(64) << 20;  // rendered text
  int max_call_depth = 200;                    // macro recursion
  uint64_t max_steps = 50'000'000;             // evaluated nodes, a bound on run time
};

class Interpreter {
 public:
  using Clock = std::function<std::tm()>;  // local time for strftime_now
  Interpreter(const TemplateAst& ast, RenderLimits limits, Clock clock);

  std::string render(const std::vector<std::pair<std::string, Value>>& vars);

  // Used by builtins, filters and methods.
  [[noreturn]] void fail(const std::string& msg) const;
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& v, CallArgs& args);
  bool apply_test(const std::string& name, const Value& v, CallArgs& args);
  std::tm now() const { return clock_(); }
  int line() const { return line_; }

 private:
  enum class Flow { Normal, Break, Continue };
  friend struct LineGuard;
  friend struct LoopObj;

  const TemplateAst& ast_;
  RenderLimits limits_;
  Clock clock_;
  std::string* out_ = nullptr;
  ScopePtr root_;
  int line_ = 1;
  int depth_ = 0;
  uint64_t steps_ = 0;

  void step();
  void emit(const std::string& s);
  Flow exec(const Body& body, const ScopePtr& scope);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope);
  std::string run_loop(const Stmt& s, const ScopePtr& scope, const Value& iterable, int depth,
                       Flow* flow_out);
  std::string capture(const Body& body, const ScopePtr& scope);
  void assign(const Expr& target, const Value& v, const ScopePtr& scope);
  Value make_macro(const Stmt& m, const ScopePtr& scope, const std::string& name);
  Value call_macro(const Stmt& m, const std::weak_ptr<Scope>& defining, const std::string& name,
                   CallArgs& args);

  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller);
  Value eval_filter(const Expr& e, const ScopePtr& scope, const Value* input);
  CallArgs eval_args(const Expr& e, const ScopePtr& scope);
};

// RAII: points error messages at the node being evaluated. On unwinding it
// keeps the innermost line so the error can report it.
struct LineGuard {
  Interpreter& in;
  int saved;
  int exceptions;
  LineGuard(Interpreter& i, int line);
  ~LineGuard();
};

}  // namespace tandem::jinja
