// The syntax tree the parser builds and the interpreter walks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace tandem::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class EK {
  Const,     // value
  Name,      // name
  NSRef,     // name.attr as an assignment target
  List,      // items
  Tuple,     // items
  Dict,      // items: key, value, key, value, ...
  Getattr,   // a.name
  Getitem,   // a[b]
  Slice,     // a:b:c (any may be null)
  Call,      // a(items..., kwargs..., *dyn_args, **dyn_kwargs)
  Filter,    // a | name(items..., kwargs...); a is null inside filter blocks
  Test,      // a is name(items..., kwargs...)
  Not,       // not a
  Neg,       // -a
  Pos,       // +a
  Binary,    // a name b, name one of + - * / // % **
  Concat,    // items joined with ~
  Compare,   // items[0] ops[0] items[1] ops[1] items[2] ...
  And,       // a and b
  Or,        // a or b
  CondExpr,  // b if a else c (c may be null)
};

struct Expr {
  EK kind = EK::Const;
  int line = 1;
  Value value;
  std::string name;
  std::string attr;  // NSRef attribute
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr a, b, c;
  ExprPtr dyn_args, dyn_kwargs;
};

enum class SK {
  Output,       // exprs printed in order (template data is a Const string)
  If,           // test, body, else_body (elif is a nested If in else_body)
  For,          // target, expr (iterable), test (filter, may be null), body, else_body
  Set,          // target = expr
  SetBlock,     // target = rendered body, optionally through filter (an EK::Filter chain)
  Macro,        // name(params = defaults) body
  CallBlock,    // {% call(params) expr %} body
  FilterBlock,  // {% filter filter %} body
  With,         // targets/values, body in a new scope
  Break,
  Continue,
  Scope,  // body rendered in place (block, generation, autoescape)
};

struct Stmt {
  SK kind = SK::Output;
  int line = 1;
  std::vector<ExprPtr> exprs;    // Output; With values
  std::vector<ExprPtr> targets;  // With targets
  ExprPtr target, expr, test, filter;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  bool recursive = false;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
};

struct TemplateAst {
  Body body;
};

}  // namespace tandem::jinja
