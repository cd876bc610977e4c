#!/usr/bin/env python3
"""Random expressions (literals, operators, filters, tests, methods, slicing) rendered by jinja2 in
transformers' configuration and by tandem; prints the disagreements.
Usage: python3 rand_diff.py SEED COUNT   (needs jinja2 and $JINJA_BATCH, see README.md)
"""
import json, os, random, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_env import env
random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
CTX = {"s": "Hello Wörld", "e": "", "n": 7, "f": 2.5, "neg": -3, "l": [3, 1, 2], "ls": ["b", "A", "c"],
       "d": {"b": 1, "a": [1, 2], "c": {"x": None}}, "ds": [{"k": "x", "v": 2}, {"k": "y", "v": 1}],
       "t": True, "z": None, "u8": "日本語 ñ 😀"}
LITS = ["1", "0", "-2", "2.5", "1e3", "'a'", "'ab c'", "\"x'y\"", "[]", "[1, 2]", "['a', 'b']", "{}",
        "{'k': 1}", "none", "true", "false", "(1, 2)", "''", "'  pad '", "0.1"]
VARS = list(CTX) + ["missing"]
FILTERS = ["trim", "length", "upper", "lower", "title", "capitalize", "list", "first", "last", "string",
           "int", "float", "round", "abs", "reverse", "unique", "sort", "tojson", "join", "join(',')",
           "default('D')", "d(1, true)", "replace('l', 'L')", "indent(2)", "items", "dictsort", "sum",
           "min", "max", "map('string')", "select", "reject", "map('upper')", "selectattr('k')",
           "map(attribute='v')", "batch(2)", "center(9)", "wordcount", "count", "safe", "e", "tojson(indent=1)",
           "sort(reverse=true)", "format(1)", "attr('k')", "pprint"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "boolean", "true", "false", "odd", "even", "lower", "upper", "callable",
         "divisibleby 2", "equalto 1", "in [1, 'a']", "sameas none", "gt 1"]
METHODS = ["strip()", "upper()", "split()", "split('l')", "startswith('He')", "endswith('d')", "replace('o', '0')",
           "find('l')", "count('l')", "lower()", "title()", "items()", "keys()", "values()", "get('a')",
           "get('q', 5)", "rstrip('d')", "lstrip('H')", "splitlines()", "isdigit()", "index(1)", "zfill(4)",
           "format(1)", "capitalize()", "partition('l')"]
OPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]

def expr(depth=0):
    r = random.random()
    if depth > 3 or r < 0.25:
        return random.choice(LITS + VARS)
    if r < 0.40:
        return f"({expr(depth+1)} {random.choice(OPS)} {expr(depth+1)})"
    if r < 0.55:
        return f"({expr(depth+1)} | {random.choice(FILTERS)})"
    if r < 0.63:
        return f"({expr(depth+1)} is {random.choice(['', 'not '])}{random.choice(TESTS)})"
    if r < 0.72:
        return f"{random.choice(VARS)}.{random.choice(METHODS)}"
    if r < 0.80:
        a = random.choice(['', '1', '-1', '0']); b = random.choice(['', '2', '-1']); c = random.choice(['', ':-1', ':2'])
        return f"{random.choice(VARS)}[{a}:{b}{c}]"
    if r < 0.86:
        return f"{random.choice(VARS)}[{random.choice(['0', '-1', '5', repr('a'), repr('b')])}]"
    if r < 0.92:
        return f"({expr(depth+1)} if {expr(depth+1)} else {expr(depth+1)})"
    if r < 0.96:
        return f"(not {expr(depth+1)})"
    return f"[{expr(depth+1)}, {expr(depth+1)}]"

cases = []
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2000):
    src = "{{ " + expr() + " }}"
    if random.random() < 0.2:
        src = "{% for x in " + expr() + " %}{{ loop.index }}{{ x }}{% if loop.last %}.{% endif %}{% else %}E{% endfor %}"
    cases.append([src, CTX])
json.dump(cases, open('/tmp/jinja_rand.json', 'w'))
res = json.loads(subprocess.run([os.environ.get('JINJA_BATCH', '/tmp/jinja_batch'), '/tmp/jinja_rand.json'], capture_output=True).stdout)
bad = 0
for (src, ctx), got in zip(cases, res):
    try:
        import copy; want = env.from_string(src).render(**copy.deepcopy(ctx))
    except Exception as e:
        want = "ERR " + str(e)
    if want.startswith("ERR") and got.startswith("ERR"):
        continue
    if "object at 0x" in want or "generator object" in want or "built-in method" in want or "dict_items" in want or "dict_keys" in want or "dict_values" in want or "reverseiterator" in want or "<function" in want:
        continue
    if want != got:
        bad += 1
        if bad <= 25:
            print("SRC ", src); print("  py", repr(want)[:200]); print("  cc", repr(got)[:200])
print(f"{len(cases) - bad}/{len(cases)} agree")
