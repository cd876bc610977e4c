#!/usr/bin/env python3
"""Random statement/whitespace-control templates (if/for/set/raw/comments, -, +) rendered by jinja2 in
transformers' configuration and by tandem; prints the disagreements.
Usage: python3 rand_ws.py SEED COUNT   (needs jinja2 and $JINJA_BATCH, see README.md)
"""
import copy, json, os, random, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_env import env
random.seed(int(sys.argv[1]))
TEXT = ["", " ", "  ", "\n", "\n\n", " \n", "\n  ", "\t", "x", "a b", " y\n", "\u00a0", "\n\t z ", "\r\n", "é"]
def t(): return "".join(random.choice(TEXT) for _ in range(random.randint(0, 3)))
def sign(): return random.choice(["", "", "-", "+"])
def tag(body): return "{%" + sign() + " " + body + " " + sign() + "%}"
def var(e): return "{{" + random.choice(["", "-", "+"]) + " " + e + " " + random.choice(["", "-"]) + "}}"
def com(): return "{#" + sign() + " c " + sign() + "#}"
def block(depth=0):
    parts = []
    for _ in range(random.randint(1, 4)):
        r = random.random()
        parts.append(t())
        if r < 0.2 or depth > 2:
            parts.append(var(random.choice(["x", "'s'", "i", "loop.index if loop is defined else 0", "ns.v"])))
        elif r < 0.35:
            parts.append(com())
        elif r < 0.55:
            parts.append(tag("if " + random.choice(["x", "not x", "i is defined"])) + block(depth+1) +
                         (tag("else") + block(depth+1) if random.random() < 0.4 else "") + tag("endif"))
        elif r < 0.75:
            parts.append(tag("for i in " + random.choice(["[1, 2]", "[]", "range(3)", "'ab'"])) + block(depth+1) +
                         (tag("else") + block(depth+1) if random.random() < 0.3 else "") + tag("endfor"))
        elif r < 0.85:
            parts.append(tag("set ns.v = ns.v ~ 'v'"))
        elif r < 0.92:
            parts.append(tag("set q") + block(depth+1) + tag("endset") + var("q"))
        else:
            parts.append(tag("raw") + t() + "{{ not }}" + t() + tag("endraw"))
        parts.append(t())
    return "".join(parts)
cases = []
for i in range(int(sys.argv[2])):
    src = "{% set ns = namespace(v='') %}" + block() + random.choice(["", "\n", "\n\n", " "])
    cases.append([src, {"x": random.choice([True, False])}])
json.dump(cases, open('/tmp/jinja_rws.json', 'w'))
res = json.loads(subprocess.run([os.environ.get('JINJA_BATCH', '/tmp/jinja_batch'), '/tmp/jinja_rws.json'], capture_output=True).stdout)
bad = 0
for (src, ctx), got in zip(cases, res):
    try:
        want = env.from_string(src).render(**ctx)
    except Exception as e:
        want = "ERR " + str(e)
    if want.startswith("ERR") and got.startswith("ERR"): continue
    if want != got:
        bad += 1
        if bad <= 8:
            print("SRC ", repr(src)); print("  py", repr(want)[:300]); print("  cc", repr(got)[:300])
print(f"{len(cases) - bad}/{len(cases)} agree")
