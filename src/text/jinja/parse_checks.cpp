// Checks run on the syntax tree after parsing: which names a macro body
// uses (varargs, kwargs, caller), and Jinja's compile-time rejection of
// unknown filters and tests.
#include "text/jinja/parse_checks.h"

#include "text/jinja/error.h"
#include "text/jinja/parser.h"

namespace tandem::jinja {

namespace {

const char* const kFilters[] = {
    "abs",    "attr",       "batch",       "capitalize", "center",   "count",
    "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
    "first",  "float",      "forceescape", "format",     "groupby",  "indent",
    "int",    "items",      "join",        "last",       "length",   "list",
    "lower",  "map",        "max",         "min",        "pprint",   "random",
    "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
    "select", "selectattr", "slice",       "sort",       "string",   "striptags",
    "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
    "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};
const char* const kTests[] = {
    "!=",       "<",        "<=",          "==",       ">",           ">=",       "boolean",
    "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",  "even",
    "false",    "filter",   "float",       "ge",       "greaterthan", "gt",       "in",
    "integer",  "iterable", "le",          "lessthan", "lower",       "lt",       "mapping",
    "ne",       "none",     "number",      "odd",      "sameas",      "sequence", "string",
    "test",     "true",     "undefined",   "upper"};

void scan_names(const Expr* e, Stmt& m) {
  if (!e) return;
  if (e->kind == EK::Name) {
    if (e->name == "varargs") m.uses_varargs = true;
    if (e->name == "kwargs") m.uses_kwargs = true;
    if (e->name == "caller") m.uses_caller = true;
  }
  for (const auto& i : e->items) scan_names(i.get(), m);
  for (const auto& kv : e->kwargs) scan_names(kv.second.get(), m);
  scan_names(e->a.get(), m);
  scan_names(e->b.get(), m);
  scan_names(e->c.get(), m);
  scan_names(e->dyn_args.get(), m);
  scan_names(e->dyn_kwargs.get(), m);
}

void scan_body(const Body& b, Stmt& m) {
  for (const auto& s : b) {
    for (const auto& e : s->exprs) scan_names(e.get(), m);
    scan_names(s->target.get(), m);
    scan_names(s->expr.get(), m);
    scan_names(s->test.get(), m);
    scan_names(s->filter.get(), m);
    for (const auto& d : s->defaults) scan_names(d.get(), m);
    scan_body(s->body, m);
    scan_body(s->else_body, m);
  }
}

// Jinja's compiler rejects unknown filters/tests outside `if` bodies and
// conditional expressions.
void check_expr(const Expr* e, bool soft) {
  if (!e) return;
  if (e->kind == EK::CondExpr) soft = true;
  if (!soft) {
    if (e->kind == EK::Filter && !is_known_filter(e->name))
      throw TemplateError("No filter named '" + e->name + "'.", e->line);
    if (e->kind == EK::Test && !is_known_test(e->name))
      throw TemplateError("No test named '" + e->name + "'.", e->line);
  }
  for (const auto& i : e->items) check_expr(i.get(), soft);
  for (const auto& kv : e->kwargs) check_expr(kv.second.get(), soft);
  check_expr(e->a.get(), soft);
  check_expr(e->b.get(), soft);
  check_expr(e->c.get(), soft);
  check_expr(e->dyn_args.get(), soft);
  check_expr(e->dyn_kwargs.get(), soft);
}

void check_body(const Body& b, bool soft) {
  for (const auto& s : b) {
    const bool inner_soft = s->kind == SK::If ? true : (s->kind == SK::Scope ? soft : false);
    const bool own_soft = s->kind == SK::If ? true : soft;
    for (const auto& e : s->exprs) check_expr(e.get(), own_soft);
    check_expr(s->target.get(), own_soft);
    check_expr(s->expr.get(), own_soft);
    check_expr(s->test.get(), own_soft);
    check_expr(s->filter.get(), own_soft);
    for (const auto& d : s->defaults) check_expr(d.get(), false);
    check_body(s->body, inner_soft);
    check_body(s->else_body, inner_soft);
  }
}

}  // namespace

bool is_known_filter(std::string_view name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

bool is_known_test(std::string_view name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

void scan_macro_body(Stmt& m) {
  scan_body(m.body, m);
}

void check_names(const TemplateAst& ast) {
  check_body(ast.body, false);
}

}  // namespace tandem::jinja
