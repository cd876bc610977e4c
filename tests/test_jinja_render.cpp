// Rendering checks of the Jinja interpreter: each case's expected output was
// produced by jinja2 configured as transformers configures it
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
// transformers' tojson/raise_exception/strftime_now).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/jinja/template.h"

namespace tandem::jinja {
namespace {

struct Case {
  const char* src;
  const char* ctx;  // JSON object of template variables
  const char* want;
};

std::string render(const std::string& src, const std::string& ctx_json) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(ctx_json);
  std::vector<std::pair<std::string, Value>> vars;
  for (auto it = ctx.begin(); it != ctx.end(); ++it)
    vars.emplace_back(it.key(), from_json(it.value()));
  return Template(src).render(vars);
}

void run_cases(const std::vector<Case>& cases) {
  for (const auto& c : cases) {
    std::string got;
    try {
      got = render(c.src, c.ctx);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "template: " << c.src << "\nthrew: " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.want) << "template: " << c.src;
  }
}

TEST(JinjaRender, Statements) {
  run_cases({
      {R"~~({% if x %}a{% elif y %}b{% else %}c{% endif %})~~", R"~~({"x": 0, "y": 1})~~",
       R"~~(b)~~"},
      {R"~~({% for i in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %})~~",
       R"~~({})~~", R"~~(10TrueFalse332;21FalseFalse321;32FalseTrue310;)~~"},
      {R"~~({% for i in 'abc' %}{{ loop.previtem }}|{{ loop.nextitem }};{% endfor %})~~",
       R"~~({})~~", R"~~(|b;a|c;b|;)~~"},
      {R"~~({% for i in [] %}x{% else %}empty{% endfor %})~~", R"~~({})~~", R"~~(empty)~~"},
      {R"~~({% for i in range(10) if i is even %}{{ i }}{{ loop.length }},{% endfor %})~~",
       R"~~({})~~", R"~~(05,25,45,65,85,)~~"},
      {R"~~({% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %})~~",
       R"~~({})~~", R"~~(023)~~"},
      {R"~~({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %})~~",
       R"~~({"d": {"b": 1, "a": 2}})~~", R"~~(b=1;a=2;)~~"},
      {R"~~({% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }})~~",
       R"~~({})~~", R"~~(231)~~"},
      {R"~~({% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}{{ ns.s }})~~",
       R"~~({})~~", R"~~(60123)~~"},
      {R"~~({% set a, b = [1, 2] %}{{ b }}{{ a }})~~", R"~~({})~~", R"~~(21)~~"},
      {R"~~({% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}])~~", R"~~({})~~", R"~~([block 2])~~"},
      {R"~~({% set x | upper | replace('B', 'b') %}abc{% endset %}{{ x }})~~", R"~~({})~~",
       R"~~(AbC)~~"},
      {R"~~({% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punct='?') }})~~",
       R"~~({})~~", R"~~(Hi Ann! Hi Bo?)~~"},
      {R"~~({% macro f() %}{{ varargs | length }}{{ kwargs.k }}{% endmacro %}{{ f(1, 2, k=3) }})~~",
       R"~~({})~~", R"~~(23)~~"},
      {R"~~({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold{% endcall %})~~",
       R"~~({})~~", R"~~(<b>bold</b>)~~"},
      {R"~~({% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }})~~",
       R"~~({})~~", R"~~(3210)~~"},
      {R"~~({% filter upper %}shout {{ 'it' }}{% endfilter %})~~", R"~~({})~~", R"~~(SHOUT IT)~~"},
      {R"~~({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])~~", R"~~({})~~",
       R"~~(3[])~~"},
      {R"~~({% raw %}{{ not evaluated }}{% endraw %})~~", R"~~({})~~",
       R"~~({{ not evaluated }})~~"},
      {R"~~({% for row in rows recursive %}[{{ row.n }}{% if row.c %}{{ loop(row.c) }}{% endif %}]{% endfor %})~~",
       R"~~({"rows": [{"n": 1, "c": [{"n": 2, "c": []}]}, {"n": 3}]})~~", R"~~([1[2]][3])~~"},
      {R"~~({% for x in [1,2] %}{% for y in 'ab' %}{{ loop.index }}{{ y }}{% endfor %}{{ loop.index }}{% endfor %})~~",
       R"~~({})~~", R"~~(1a2b11a2b2)~~"},
  });
}

TEST(JinjaRender, Whitespace) {
  run_cases({
      {R"~~(<ul>
  {% for i in [1,2] %}
  <li>{{ i }}</li>
  {% endfor %}
</ul>
)~~",
       R"~~({})~~",
       R"~~(<ul>
  <li>1</li>
  <li>2</li>
</ul>)~~"},
      {R"~~(a  {%- if true -%}  b  {%- endif -%}  c)~~", R"~~({})~~", R"~~(abc)~~"},
      {R"~~(a
  {%+ if true %}b{% endif +%}
c)~~",
       R"~~({})~~",
       R"~~(a
  b
c)~~"},
      {R"~~(x {{- ' y ' -}} z
{{ 1 }}
)~~",
       R"~~({})~~",
       R"~~(x y z
1)~~"},
      {R"~~(line1
    {# comment #}
line2
  {#- c2 -#}  
line3)~~",
       R"~~({})~~",
       R"~~(line1
line2line3)~~"},
      {R"~~({% if true %}
keep
{% endif %}
)~~",
       R"~~({})~~",
       R"~~(keep
)~~"},
      {R"~~(  {{ 'var tags are not lstripped' }}
)~~",
       R"~~({})~~", R"~~(  var tags are not lstripped)~~"},
      {"a\r\nb\rc\n\n", R"~~({})~~",
       R"~~(a
b
c
)~~"},
      {R"~~(	{% if true %}	tab{% endif %})~~", R"~~({})~~", R"~~(	tab)~~"},
  });
}

TEST(JinjaRender, Expressions) {
  run_cases({
      {R"~~({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }})~~",
       R"~~({})~~", R"~~(7 9 3.5 3 -4 1 2 64 4)~~"},
      {R"~~({{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }})~~",
       R"~~({})~~", R"~~(a1NoneTrue abab [1, 2] xy)~~"},
      {R"~~({{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ (1, 2) == [1, 2] }})~~",
       R"~~({})~~", R"~~(True False True True True True False)~~"},
      {R"~~({{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }})~~",
       R"~~({})~~", R"~~(True True True True)~~"},
      {R"~~({{ 0 or 'x' }} {{ '' and 'y' }} {{ none or [] }} {{ not 0 }} {{ 1 and 2 }})~~",
       R"~~({})~~", R"~~(x  [] True 2)~~"},
      {R"~~({{ 'yes' if x else 'no' }} {{ 'only' if x }}|)~~", R"~~({"x": false})~~",
       R"~~(no |)~~"},
      {R"~~({{ d.a }} {{ d['a'] }} {{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ s[1:3] }} {{ s[::2] }})~~",
       R"~~({"d": {"a": 1}, "l": [1, 2, 3], "s": "héllo"})~~",
       R"~~(1 1 1 3 [2, 3] [3, 2, 1] [1, 2] él hlo)~~"},
      {R"~~({{ {'a': 1, 'b': [2]} }} {{ [1, 'two', none, true, 2.5] }} {{ (1,) }} {{ () }} {{ 'it\'s' }})~~",
       R"~~({})~~", R"~~({'a': 1, 'b': [2]} [1, 'two', None, True, 2.5] (1,) () it's)~~"},
      {R"~~({{ "a\tb\n" | tojson }} {{ 'caf\u00e9' }} {{ '\x41\101' }})~~", R"~~({})~~",
       R"~~("a\tb\n" café AA)~~"},
      {R"~~({{ 1e3 }} {{ 1.5e-7 }} {{ 10 ** 18 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 2.0 }} {{ 1_000 }} {{ 0x1F }} {{ 1e16 }} {{ 123456789.0 * 1000 }})~~",
       R"~~({})~~",
       R"~~(1000.0 1.5e-07 1000000000000000000 0.30000000000000004 0.3333333333333333 2.0 1000 31 1e+16 123456789000.0)~~"},
      {R"~~({{ True }} {{ False }} {{ None }} {{ true }} {{ none }})~~", R"~~({})~~",
       R"~~(True False None True None)~~"},
      {R"~~({{ missing }}|{{ missing is defined }}|{{ d.nope }}|{{ d.nope is undefined }})~~",
       R"~~({"d": {}})~~", R"~~(|False||True)~~"},
      {R"~~({{ none.attr }}|{{ 5.attr }}|{{ [1][7] }}|{{ 'ab'[9] }})~~", R"~~({})~~", R"~~(|||)~~"},
  });
}

TEST(JinjaRender, Filters) {
  run_cases({
      {R"~~({{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hello' | length }}|{{ [1,2] | count }}|{{ {'a':1} | length }})~~",
       R"~~({})~~", R"~~(x|hi|5|2|1)~~"},
      {R"~~({{ 'hello world' | upper }} {{ 'HeLLo' | lower }} {{ 'hello wORLD-x (y)' | title }} {{ 'hELLO wORLD' | capitalize }})~~",
       R"~~({})~~", R"~~(HELLO WORLD hello Hello World-X (Y) Hello world)~~"},
      {R"~~({{ 'a-b-a' | replace('a', 'x') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ [1, 2, 3] | join(', ') }} {{ [{'n': 'a'}, {'n': 'b'}] | join('/', attribute='n') }})~~",
       R"~~({})~~", R"~~(x-b-x bba 1, 2, 3 a/b)~~"},
      {R"~~({{ undef | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }} {{ 0 | d('zero', boolean=true) }})~~",
       R"~~({})~~", R"~~(d None d zero)~~"},
      {R"~~({{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | first }} {{ [] | first }}| {{ 'ab' | list }} {{ {'k': 1} | list }})~~",
       R"~~({})~~", R"~~(3 2 a | ['a', 'b'] ['k'])~~"},
      {R"~~({{ {'b': 1, 'a': 2} | items | list }} {{ {'b': 1, 'A': 2, 'a': 0} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }})~~",
       R"~~({})~~",
       R"~~([('b', 1), ('a', 2)] [('A', 2), ('a', 0), ('b', 1)] [('a', 2), ('b', 1)])~~"},
      {R"~~({{ users | selectattr('active') | map(attribute='name') | list }} {{ users | rejectattr('active') | map(attribute='name') | join }})~~",
       R"~~({"users": [{"name": "a", "active": true}, {"name": "b", "active": false}, {"name": "c", "active": 1}]})~~",
       R"~~(['a', 'c'] b)~~"},
      {R"~~({{ users | selectattr('age', 'gt', 30) | map(attribute='name') | list }} {{ users | map(attribute='missing', default='?') | list }})~~",
       R"~~({"users": [{"name": "a", "age": 40}, {"name": "b", "age": 20}]})~~",
       R"~~(['a'] ['?', '?'])~~"},
      {R"~~({{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ ['a', 'B'] | map('upper') | list }})~~",
       R"~~({})~~", R"~~([1, 3] [2, 4] [1, 'a'] ['A', 'B'])~~"},
      {R"~~({{ 42 | string }} {{ [1] | string }} {{ '12' | int + 1 }} {{ '3.9' | int }} {{ 'x' | int }} {{ 'x' | int(-1) }} {{ '0x1A' | int(0, 16) }} {{ 2 | float }} {{ '2.5' | float }} {{ 'y' | float }})~~",
       R"~~({})~~", R"~~(42 [1] 13 3 0 -1 26 2.0 2.5 0.0)~~"},
      {R"~~({{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(0, 'floor') }} {{ 7 | round }} {{ -1.5 | abs }})~~",
       R"~~({})~~", R"~~(2.57 2.0 4.0 3.0 2.0 7 1.5)~~"},
      {R"~~({{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, first=true) }}|{{ 'a\n\nb' | indent('> ', blank=true) }})~~",
       R"~~({})~~",
       R"~~(a
    b

    c|  a
  b|a
> 
> b)~~"},
      {R"~~({{ [1, 2, 1, 'A', 'a'] | unique | list }} {{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }})~~",
       R"~~({})~~", R"~~([1, 2, 'A'] [1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'])~~"},
      {R"~~({{ [{'a': 2, 'b': 1}, {'a': 1, 'b': 2}] | sort(attribute='a') | map(attribute='b') | list }} {{ [5, 1, 9] | min }} {{ [5, 1, 9] | max }} {{ [1, 2.5] | sum }} {{ [{'v': 2}, {'v': 3}] | sum(attribute='v') }})~~",
       R"~~({})~~", R"~~([2, 1] 1 9 3.5 5)~~"},
      {R"~~({{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ 'a b c' | wordcount }} {{ 'x' | center(5) }}|)~~",
       R"~~({})~~", R"~~(cba [2, 1] [[1, 2], [3, 4], [5]] 3   x  |)~~"},
      {R"~~({{ '<b>' | e }} {{ '<b>' | safe }} {{ ('<a>' | safe) + '<b>' }} {{ '%s=%d' | format('k', 3) }} {{ 'x' | safe | length }})~~",
       R"~~({})~~", R"~~(&lt;b&gt; <b> <a>&lt;b&gt; k=3 1)~~"},
      {R"~~({{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(separators=(',', ':')) }}|{{ 'é€😀' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }})~~",
       R"~~({"x": {"b": [1, 2.0, null, true, "s\"q"], "a": {}, "c": []}})~~",
       R"~~({"b": [1, 2.0, null, true, "s\"q"], "a": {}, "c": []}|{
  "b": [
    1,
    2.0,
    null,
    true,
    "s\"q"
  ],
  "a": {},
  "c": []
}|{"a": {}, "b": [1, 2.0, null, true, "s\"q"], "c": []}|{"b":[1,2.0,null,true,"s\"q"],"a":{},"c":[]}|"é€😀"|"\u00e9")~~"},
      {R"~~({{ [1.0, 1e-7, 3.14, 1e100, -0.0, 1234567890123456789] | tojson }})~~", R"~~({})~~",
       R"~~([1.0, 1e-07, 3.14, 1e+100, -0.0, 1234567890123456789])~~"},
      {R"~~({{ 'x' | attr('upper') is callable }} {{ users | map('tojson') | join(',') }})~~",
       R"~~({"users": [{"a": 1}]})~~", R"~~(True {"a": 1})~~"},
  });
}

TEST(JinjaRender, Tests) {
  run_cases({
      {R"~~({{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ n is iterable }}{{ l is sequence }}{{ d is sequence }}{{ i is sequence }})~~",
       R"~~({"x": 1, "n": null, "s": "s", "d": {}, "l": [], "i": 3})~~",
       R"~~(TrueTrueTrueTrueTrueTrueTrueFalseTrueTrueFalse)~~"},
      {R"~~({{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }})~~",
       R"~~({})~~", R"~~(TrueTrueTrueTrueFalseTrueTrueFalseTrueFalseTrueFalse)~~"},
      {R"~~({{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 1 is eq 2 }}{{ 2 is gt 1 }}{{ 2 is lessthan 1 }}{{ 'x' is in 'xyz' }}{{ 1 is in [2] }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'A1' is upper }})~~",
       R"~~({})~~", R"~~(TrueTrueTrueTrueFalseTrueFalseTrueFalseTrueTrueTrue)~~"},
      {R"~~({{ x is sameas none }}{{ true is sameas true }}{{ range is callable }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'nope' is filter }})~~",
       R"~~({"x": null})~~", R"~~(TrueTrueTrueTrueTrueFalse)~~"},
      {R"~~({{ x is not none }}{{ not x is none }}{{ x is not defined }})~~", R"~~({"x": 0})~~",
       R"~~(TrueTrueFalse)~~"},
  });
}

TEST(JinjaRender, Methods) {
  run_cases({
      {R"~~({{ ' a b '.strip() }}|{{ 'xxax'.lstrip('x') }}|{{ 'axx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a-b-c'.rsplit('-', 1) }})~~",
       R"~~({})~~", R"~~(a b|ax|a|['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a-b', 'c'])~~"},
      {R"~~({{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith(('x', 'lo')) }}{{ 'Hello'.startswith('l', 2) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hi there'.title() }}{{ 'hI'.capitalize() }}{{ 'aXb'.swapcase() }})~~",
       R"~~({})~~", R"~~(TrueTrueTrueHIhiHi ThereHiAxB)~~"},
      {R"~~({{ 'a.b.c'.replace('.', '/') }}{{ 'abcabc'.find('c') }}{{ 'abcabc'.rfind('c') }}{{ 'abc'.find('z') }}{{ 'aaa'.count('a') }}{{ '-'.join(['a', 'b']) }}{{ 'x\ny\r\nz'.splitlines() }})~~",
       R"~~({})~~", R"~~(a/b/c25-13a-b['x', 'y', 'z'])~~"},
      {R"~~({{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'Ab'.isupper() }}{{ 'ab'.islower() }}{{ '7'.zfill(3) }}{{ 'ab'.center(6, '*') }}{{ 'ab'.ljust(4, '.') }}{{ 'ab'.rjust(4) }})~~",
       R"~~({})~~", R"~~(TrueTrueTrueFalseTrue007**ab**ab..  ab)~~"},
      {R"~~({{ 'prefix-x'.removeprefix('prefix-') }}{{ 'x.txt'.removesuffix('.txt') }}{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ '{} and {name}'.format(1, name='n') }})~~",
       R"~~({})~~", R"~~(xx('a', '=', 'b=c')('a=b', '=', 'c')1 and n)~~"},
      {R"~~({{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 0) }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ l.index(2) }}{{ l.count(1) }})~~",
       R"~~({"d": {"a": 1, "b": 2}, "l": [1, 2, 1]})~~",
       R"~~(1None0['a', 'b'][1, 2][('a', 1), ('b', 2)]12)~~"},
  });
}

TEST(JinjaRender, Globals) {
  run_cases({
      {R"~~({{ range(3) | list }}{{ range(2, 5) | list }}{{ range(10, 0, -3) | list }}{{ range(0) | list }})~~",
       R"~~({})~~", R"~~([0, 1, 2][2, 3, 4][10, 7, 4, 1][])~~"},
      {R"~~({% set ns = namespace(a=1) %}{% set ns.b = 2 %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}{{ namespace({'x': 1}).x }})~~",
       R"~~({})~~", R"~~(12False1)~~"},
      {R"~~({{ dict(a=1, b=2) }}{{ dict({'x': 1}, y=2) }}{% set j = joiner('|') %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %})~~",
       R"~~({})~~", R"~~({'a': 1, 'b': 2}{'x': 1, 'y': 2}1|2|3)~~"},
  });
}

TEST(JinjaRender, MoreFilters) {
  run_cases({
      {R"~~({{ "hello world foo bar baz" | truncate(12) }}|{{ "hello world foo bar baz" | truncate(12, true) }}|{{ "abcdefghijklmnop" | truncate(10, end="~") }})~~",
       "{}", R"~~(hello...|hello wor...|abcdefghi~)~~"},
      {R"~~({{ [1,2,3,4,5] | slice(3, "x") | list }})~~", "{}",
       R"~~([[1, 2], [3, 4], [5, 'x']])~~"},
      {R"~~({{ "a b/c&d=é" | urlencode }}|{{ {"k y": "v/w", "n": 1} | urlencode }})~~", "{}",
       R"~~(a%20b/c%26d%3D%C3%A9|k+y=v%2Fw&n=1)~~"},
  });
}

TEST(JinjaRender, GenerationTagRendersItsBody) {
  EXPECT_EQ(render("a{% generation %}b{{ 1 }}{% endgeneration %}c", "{}"), "ab1c");
}

}  // namespace
}  // namespace tandem::jinja
