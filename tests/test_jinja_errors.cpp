// Template errors become tandem::Error with the template's message and line,
// never a crash; runaway templates hit caps instead of hanging.
#include <gtest/gtest.h>

#include <string>

#include "text/jinja/error.h"
#include "text/jinja/template.h"

namespace tandem::jinja {
namespace {

struct Failure {
  std::string message;
  int line = 0;
  std::string what;
};

Failure fail_of(const std::string& src, const RenderOptions& opts = {},
                std::vector<std::pair<std::string, Value>> vars = {}) {
  try {
    Template t(src);
    std::string out = t.render(vars, opts);
    ADD_FAILURE() << "expected an error from: " << src << "\nrendered: " << out;
  } catch (const TemplateError& e) {
    return {e.message(), e.line(), e.what()};
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-template exception: " << e.what();
  }
  return {};
}

TEST(JinjaErrors, RaiseExceptionCarriesMessageAndLine) {
  Failure f =
      fail_of("line1\n{% if true %}\n{{ raise_exception('Roles must alternate') }}\n{% endif %}");
  EXPECT_EQ(f.message, "Roles must alternate");
  EXPECT_EQ(f.line, 3);
  EXPECT_NE(f.what.find("line 3"), std::string::npos) << f.what;
  // It is a tandem::Error, the project's one error type at the API boundary.
  EXPECT_THROW(Template("{{ raise_exception('x') }}").render({}), tandem::Error);
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  Failure f = fail_of("ok\n{% if x %}\nno end");
  EXPECT_NE(f.message.find("endif"), std::string::npos) << f.message;
  f = fail_of("a\n\n{{ 1 + }}");
  EXPECT_EQ(f.line, 3);
  f = fail_of("{% for x in %}{% endfor %}");
  EXPECT_FALSE(f.message.empty());
  f = fail_of("{{ 'unterminated }}");
  EXPECT_NE(f.message.find("unexpected char"), std::string::npos) << f.message;
  f = fail_of("{# never closed");
  EXPECT_EQ(f.message, "Missing end of comment tag");
  f = fail_of("{{ (1 }}");
  EXPECT_FALSE(f.message.empty());
  f = fail_of("{{ x ]] }}");
  EXPECT_NE(f.message.find("unexpected ']'"), std::string::npos) << f.message;
  f = fail_of("{% endfor %}");
  EXPECT_FALSE(f.message.empty());
}

TEST(JinjaErrors, UnknownTagsFiltersAndTests) {
  EXPECT_EQ(fail_of("{% do x %}").message, "Encountered unknown tag 'do'.");
  EXPECT_EQ(fail_of("{{ x | nope }}").message, "No filter named 'nope'.");
  EXPECT_EQ(fail_of("{{ x is nope }}").message, "No test named 'nope'.");
  // Like Jinja, an unknown filter inside an `if` fails only when it runs.
  EXPECT_EQ(Template("{% if false %}{{ x | nope }}{% endif %}ok").render({}), "ok");
  EXPECT_EQ(fail_of("{% if true %}{{ x | nope }}{% endif %}").message, "No filter named 'nope'.");
  // An unknown filter in a loop body fails at parse time even if never run.
  EXPECT_EQ(fail_of("{% for i in [] %}{{ i | nope }}{% endfor %}").message,
            "No filter named 'nope'.");
}

TEST(JinjaErrors, RuntimeTypeErrorsUsePythonMessages) {
  EXPECT_EQ(fail_of("{{ 'a' + 1 }}").message, "can only concatenate str (not \"int\") to str");
  EXPECT_EQ(fail_of("{{ 1 + 'a' }}").message, "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(fail_of("{{ 1 / 0 }}").message, "division by zero");
  EXPECT_EQ(fail_of("{{ 1 < 'a' }}").message,
            "'<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(fail_of("{{ 1 in 'abc' }}").message,
            "'in <string>' requires string as left operand, not int");
  EXPECT_EQ(fail_of("{{ x.y.z }}").message, "'x' is undefined");
  EXPECT_EQ(fail_of("{{ d.a.b }}", {}, {{"d", Value::new_dict()}}).message,
            "'dict object' has no attribute 'a'");
  EXPECT_EQ(fail_of("{{ messages[0].role }}", {}, {{"messages", Value::new_list()}}).message,
            "list object has no element 0");
  EXPECT_EQ(fail_of("{{ none | tojson }}{{ x | tojson }}").message,
            "Object of type Undefined is not JSON serializable");
  EXPECT_EQ(fail_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").message,
            "too many values to unpack (expected 2)");
  EXPECT_EQ(fail_of("{% set x = 1 %}{% set x.y = 2 %}").message,
            "cannot assign attribute on non-namespace object");
  EXPECT_EQ(fail_of("{{ 5() }}").message, "'int' object is not callable");
}

TEST(JinjaErrors, BreakOutsideALoopIsASyntaxError) {
  EXPECT_EQ(fail_of("a{% break %}b").message, "'break' outside loop");
  EXPECT_EQ(
      fail_of("{% for i in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}").message,
      "'continue' outside loop");
  EXPECT_EQ(Template("{% for i in [1, 2] %}{% if true %}{{ i }}{% break %}{% endif %}{% endfor %}")
                .render({}),
            "1");
}

TEST(JinjaErrors, MacroArgumentErrors) {
  EXPECT_EQ(fail_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}").message,
            "macro 'f' takes not more than 1 argument(s)");
  EXPECT_EQ(fail_of("{% macro f(a) %}{% endmacro %}{{ f(b=1) }}").message,
            "macro 'f' takes no keyword argument 'b'");
}

TEST(JinjaErrors, SandboxBlocksMutationAndHugeRanges) {
  // list.append is unsafe in transformers' ImmutableSandboxedEnvironment.
  Failure f = fail_of("{% set l = [] %}{% set _ = l.append(1) %}");
  EXPECT_NE(f.message.find("unsafe"), std::string::npos) << f.message;
  f = fail_of("{{ range(1000000) | length }}");
  EXPECT_NE(f.message.find("MAX_RANGE"), std::string::npos) << f.message;
}

TEST(JinjaErrors, RunawayTemplatesHitCaps) {
  RenderOptions tight;
  tight.limits.max_steps = 100000;
  Failure f = fail_of(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", tight);
  EXPECT_NE(f.message.find("budget"), std::string::npos) << f.message;

  f = fail_of("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  EXPECT_NE(f.message.find("recursion"), std::string::npos) << f.message;

  RenderOptions small;
  small.limits.max_output_bytes = 1000;
  f = fail_of("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", small);
  EXPECT_NE(f.message.find("exceeds"), std::string::npos) << f.message;

  f = fail_of("{{ 'x' * 1000000000000 }}");
  EXPECT_NE(f.message.find("too large"), std::string::npos) << f.message;

  std::string deep(5000, '(');
  f = fail_of("{{ " + deep + "1" + std::string(5000, ')') + " }}");
  EXPECT_NE(f.message.find("nested too deeply"), std::string::npos) << f.message;

  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  f = fail_of(blocks);
  EXPECT_FALSE(f.message.empty());
}

TEST(JinjaErrors, StrftimeNowUsesTheInjectedClock) {
  RenderOptions o;
  o.clock = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    return tm;
  };
  EXPECT_EQ(Template("{{ strftime_now('%d %b %Y') }}").render({}, o), "26 Jul 2024");
}

}  // namespace
}  // namespace tandem::jinja
