#include "text/jinja/parser.h"

#include <algorithm>
#include <set>

#include "text/jinja/error.h"
#include "text/jinja/parse_checks.h"

namespace tandem::jinja {

namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  TemplateAst parse_template() {
    TemplateAst ast;
    ast.body = subparse({});
    if (cur().type != Tok::Eof) fail("unexpected token", cur().line);
    return ast;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // for-loop bodies around the current point (break/continue)
  std::vector<std::vector<std::string>> end_stack_;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxNesting) p.fail("template nested too deeply", p.cur().line);
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& look() const { return t_[std::min(p_ + 1, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }

  [[noreturn]] void fail(const std::string& msg, int line) const { throw TemplateError(msg, line); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data: return "template data";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return t.text;
      case Tok::String: return "string";
      case Tok::Int: return "integer";
      case Tok::Float: return "float";
      case Tok::Op: return t.text;
      case Tok::Eof: return "end of template";
    }
    return "token";
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      fail(std::string("expected token '") + op + "', got '" + describe(cur()) + "'", cur().line);
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type)
      fail(std::string("expected token '") + what + "', got '" + describe(cur()) + "'", cur().line);
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name)
      fail("expected token 'name', got '" + describe(cur()) + "'", cur().line);
    std::string n = cur().text;
    next();
    return n;
  }

  static ExprPtr make(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static StmtPtr make_stmt(SK k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  bool at_end_token(const std::vector<std::string>& ends) const {
    if (cur().type != Tok::Name) return false;
    return std::find(ends.begin(), ends.end(), cur().text) != ends.end();
  }

  // Parses statements and data until one of `ends` opens a block tag. On
  // return the current token is that end name (or Eof when ends is empty).
  Body subparse(const std::vector<std::string>& ends) {
    DepthGuard g(*this);
    Body body;
    StmtPtr out;
    auto flush = [&] {
      if (out) body.push_back(std::move(out));
    };
    while (cur().type != Tok::Eof) {
      const Token& tk = cur();
      if (tk.type == Tok::Data) {
        if (!out) out = make_stmt(SK::Output, tk.line);
        auto c = make(EK::Const, tk.line);
        c->value = Value::string(tk.text);
        out->exprs.push_back(std::move(c));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        if (!out) out = make_stmt(SK::Output, cur().line);
        out->exprs.push_back(parse_tuple(true, {}, false));
        expect(Tok::VarEnd, "end of print statement");
      } else if (tk.type == Tok::BlockBegin) {
        flush();
        next();
        if (!ends.empty() && at_end_token(ends)) return body;
        body.push_back(parse_statement());
        expect(Tok::BlockEnd, "end of statement block");
      } else {
        fail("unexpected '" + describe(tk) + "'", tk.line);
      }
    }
    flush();
    if (!ends.empty()) {
      std::string want;
      for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
      fail("Unexpected end of template. Jinja was looking for the following tags: " + want + ".",
           cur().line);
    }
    return body;
  }

  Body parse_body(const std::vector<std::string>& ends, bool drop_needle) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    Body b = subparse(ends);
    if (drop_needle) next();
    return b;
  }

  StmtPtr parse_statement() {
    const Token& tk = cur();
    if (tk.type != Tok::Name) fail("tag name expected", tk.line);
    const std::string& n = tk.text;
    const int line = tk.line;
    if (n == "if") return parse_if();
    if (n == "for") return parse_for();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "with") return parse_with();
    if (n == "print") {
      next();
      auto s = make_stmt(SK::Output, line);
      while (cur().type != Tok::BlockEnd) {
        if (!s->exprs.empty()) expect_op(",");
        s->exprs.push_back(parse_expression(true));
      }
      return s;
    }
    if (n == "break" || n == "continue") {
      if (loop_depth_ == 0) fail("'" + n + "' outside loop", line);
      next();
      return make_stmt(n == "break" ? SK::Break : SK::Continue, line);
    }
    if (n == "generation" || n == "block" || n == "autoescape") {
      next();
      std::string end = "end" + n;
      if (n == "block") expect_name();
      if (n == "autoescape") parse_expression(true);
      auto s = make_stmt(SK::Scope, line);
      s->body = parse_body({end}, true);
      if (n == "block" && cur().type == Tok::Name) next();
      return s;
    }
    if (n == "extends" || n == "include" || n == "import" || n == "from")
      fail("the '" + n + "' tag needs a template loader, which chat templates do not have", line);
    fail("Encountered unknown tag '" + n + "'.", line);
  }

  StmtPtr parse_if() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::If, line);
    s->test = parse_tuple(false, {}, false);
    s->body = parse_body({"elif", "else", "endif"}, false);
    const std::string tag = cur().text;
    next();
    if (tag == "elif") {
      // The elif tag's own test follows; reuse parse_if's shape.
      --p_;
      s->else_body.push_back(parse_if());
      return s;
    }
    if (tag == "else") s->else_body = parse_body({"endif"}, true);
    return s;
  }

  StmtPtr parse_for() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::For, line);
    s->target = parse_assign_target(true, {"in"}, false);
    if (!skip_name("in")) fail("expected token 'in', got '" + describe(cur()) + "'", cur().line);
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->test = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"}, false);
    --loop_depth_;
    const std::string tag = cur().text;
    next();
    if (tag == "else") s->else_body = parse_body({"endfor"}, true);
    return s;
  }

  StmtPtr parse_set() {
    const int line = cur().line;
    next();
    auto target = parse_assign_target(true, {}, true);
    if (skip_op("=")) {
      auto s = make_stmt(SK::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      return s;
    }
    auto s = make_stmt(SK::SetBlock, line);
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    s->body = parse_body({"endset"}, true);
    return s;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      s.params.push_back(expect_name());
      if (skip_op("="))
        s.defaults.push_back(parse_expression(true));
      else if (!s.defaults.empty())
        fail("non-default argument follows default argument", cur().line);
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::Macro, line);
    s->name = expect_name();
    parse_signature(*s);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, true);
    loop_depth_ = saved_loops;
    scan_macro_body(*s);
    return s;
  }

  StmtPtr parse_call_block() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::CallBlock, line);
    if (is_op("(")) parse_signature(*s);
    s->expr = parse_expression(true);
    if (s->expr->kind != EK::Call) fail("expected call", line);
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endcall"}, true);
    loop_depth_ = saved_loops;
    scan_macro_body(*s);
    return s;
  }

  StmtPtr parse_filter_block() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::FilterBlock, line);
    s->filter = parse_filter(nullptr, true);
    s->body = parse_body({"endfilter"}, true);
    return s;
  }

  StmtPtr parse_with() {
    const int line = cur().line;
    next();
    auto s = make_stmt(SK::With, line);
    while (cur().type != Tok::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(true, {}, false));
      expect_op("=");
      s->exprs.push_back(parse_expression(true));
    }
    s->body = parse_body({"endwith"}, true);
    return s;
  }

  ExprPtr parse_assign_target(bool with_tuple, const std::vector<std::string>& extra_end,
                              bool with_namespace) {
    ExprPtr t = with_tuple ? parse_tuple_simplified(extra_end, with_namespace)
                           : parse_primary(with_namespace);
    auto check = [&](const Expr& e) {
      if (e.kind != EK::Name && e.kind != EK::NSRef)
        fail("can't assign to " + std::string(e.kind == EK::Const ? "'const'" : "expression"),
             e.line);
    };
    if (t->kind == EK::Tuple) {
      for (auto& it : t->items) check(*it);
    } else {
      check(*t);
    }
    return t;
  }

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) return true;
    return at_end_token(extra_end);
  }

  ExprPtr parse_tuple_simplified(const std::vector<std::string>& extra_end, bool with_ns) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(parse_primary(with_ns));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      fail("Expected an expression, got '" + describe(cur()) + "'", line);
    }
    auto t = make(EK::Tuple, line);
    t->items = std::move(args);
    return t;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got '" + describe(cur()) + "'", line);
    }
    auto t = make(EK::Tuple, line);
    t->items = std::move(args);
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr e1 = parse_or();
    while (skip_name("if")) {
      auto c = make(EK::CondExpr, line);
      c->a = parse_or();
      c->b = std::move(e1);
      if (skip_name("else")) c->c = parse_condexpr();
      e1 = std::move(c);
      line = cur().line;
    }
    return e1;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      auto n = make(EK::Or, cur().line);
      next();
      n->a = std::move(l);
      n->b = parse_and();
      l = std::move(n);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      auto n = make(EK::And, cur().line);
      next();
      n->a = std::move(l);
      n->b = parse_not();
      l = std::move(n);
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto n = make(EK::Not, cur().line);
      next();
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && look().type == Tok::Name && look().text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(EK::Compare, line);
        cmp->items.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto n = make(EK::Binary, line);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  ExprPtr parse_math1() {
    const int line = cur().line;
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().text;
      next();
      l = binary(op, std::move(l), parse_concat(), line);
    }
    return l;
  }

  ExprPtr parse_concat() {
    const int line = cur().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto n = make(EK::Concat, line);
    n->items.push_back(std::move(first));
    while (skip_op("~")) n->items.push_back(parse_math2());
    return n;
  }

  ExprPtr parse_math2() {
    const int line = cur().line;
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().text;
      next();
      l = binary(op, std::move(l), parse_pow(), line);
    }
    return l;
  }

  ExprPtr parse_pow() {
    const int line = cur().line;
    ExprPtr l = parse_unary(true);
    while (skip_op("**")) l = binary("**", std::move(l), parse_unary(true), line);
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    const int line = cur().line;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto n = make(is_op("-") ? EK::Neg : EK::Pos, line);
      next();
      n->a = parse_unary(false);
      node = std::move(n);
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token tk = cur();
    if (tk.type == Tok::Name) {
      next();
      auto c = make(EK::Const, tk.line);
      if (tk.text == "true" || tk.text == "True") {
        c->value = Value::boolean(true);
      } else if (tk.text == "false" || tk.text == "False") {
        c->value = Value::boolean(false);
      } else if (tk.text == "none" || tk.text == "None") {
        c->value = Value::none();
      } else if (with_namespace && is_op(".")) {
        next();
        auto n = make(EK::NSRef, tk.line);
        n->name = tk.text;
        n->attr = expect_name();
        return n;
      } else {
        auto n = make(EK::Name, tk.line);
        n->name = tk.text;
        return n;
      }
      return c;
    }
    if (tk.type == Tok::String) {
      std::string buf;
      while (cur().type == Tok::String) {
        buf += cur().text;
        next();
      }
      auto c = make(EK::Const, tk.line);
      c->value = Value::string(std::move(buf));
      return c;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      next();
      auto c = make(EK::Const, tk.line);
      c->value = tk.type == Tok::Int ? Value::integer(tk.ival) : Value::number(tk.fval);
      return c;
    }
    if (tk.type == Tok::Op && tk.text == "(") {
      next();
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (tk.type == Tok::Op && tk.text == "[") {
      next();
      auto l = make(EK::List, tk.line);
      while (!is_op("]")) {
        if (!l->items.empty()) expect_op(",");
        if (is_op("]")) break;
        l->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return l;
    }
    if (tk.type == Tok::Op && tk.text == "{") {
      next();
      auto d = make(EK::Dict, tk.line);
      while (!is_op("}")) {
        if (!d->items.empty()) expect_op(",");
        if (is_op("}")) break;
        d->items.push_back(parse_expression(true));
        expect_op(":");
        d->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return d;
    }
    fail("unexpected '" + describe(tk) + "'", tk.line);
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard g(*this);
    const Token tk = cur();
    next();
    if (tk.text == ".") {
      const Token at = cur();
      next();
      if (at.type == Tok::Name) {
        auto n = make(EK::Getattr, tk.line);
        n->a = std::move(node);
        n->name = at.text;
        return n;
      }
      if (at.type != Tok::Int) fail("expected name or number", at.line);
      auto n = make(EK::Getitem, tk.line);
      n->a = std::move(node);
      n->b = make(EK::Const, at.line);
      n->b->value = Value::integer(at.ival);
      return n;
    }
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto n = make(EK::Getitem, tk.line);
    n->a = std::move(node);
    if (args.size() == 1) {
      n->b = std::move(args[0]);
    } else {
      n->b = make(EK::Tuple, tk.line);
      n->b->items = std::move(args);
    }
    return n;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto s = make(EK::Slice, line);
    s->a = std::move(start);
    if (!is_op(":") && !is_op("]") && !is_op(",")) s->b = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->c = parse_expression(true);
    }
    return s;
  }

  void parse_call_args(Expr& n) {
    const int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!n.dyn_args && !n.dyn_kwargs);
        next();
        n.dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!n.dyn_kwargs);
        next();
        n.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && look().type == Tok::Op && look().text == "=") {
        ensure(!n.dyn_kwargs);
        std::string key = cur().text;
        next();
        next();
        n.kwargs.emplace_back(key, parse_expression(true));
      } else {
        ensure(!n.dyn_args && !n.dyn_kwargs && n.kwargs.empty());
        n.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard g(*this);
    auto n = make(EK::Call, cur().line);
    n->a = std::move(node);
    parse_call_args(*n);
    return n;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    DepthGuard g(*this);
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      const int line = cur().line;
      std::string name = expect_name();
      while (skip_op(".")) name += "." + expect_name();
      auto f = make(EK::Filter, line);
      f->name = name;
      f->a = std::move(node);
      if (is_op("(")) parse_call_args(*f);
      node = std::move(f);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard g(*this);
    const int line = cur().line;
    next();  // 'is'
    const bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    auto t = make(EK::Test, line);
    t->name = name;
    t->a = std::move(node);
    if (is_op("(")) {
      parse_call_args(*t);
    } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                cur().type == Tok::Float || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is", cur().line);
      t->items.push_back(parse_postfix(parse_primary(false)));
    }
    if (!negated) return t;
    auto n = make(EK::Not, line);
    n->a = std::move(t);
    return n;
  }
};

}  // namespace

TemplateAst parse(std::string_view source, const LexOptions& opts) {
  Parser p(tokenize(source, opts));
  TemplateAst ast = p.parse_template();
  check_names(ast);
  return ast;
}

}  // namespace tandem::jinja
