# The prefix cache through `tandem serve --device cuda`: the same prompt of
# token ids twice, then extended by 64 ids, 16 greedy tokens each. Prints
# each request's latency, usage.prompt_tokens_details.cached_tokens and the
# generated ids (the model needs no tokenizer: synth folders have none), and
# writes them as JSON to OUT. Run it against a ready server (gpu-serve-check.py
# --wait-only) with the cache and one with --no-prefix-cache: the ids must
# match, cached_tokens must not.
#
#   python3 scripts/gpu-prefix-check.py http://127.0.0.1:PORT OUT.json
import json, sys, time, urllib.request
url = sys.argv[1]
MODEL = json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"][0]["id"]
def req(prompt):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    t = time.time()
    r = urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"}), timeout=120)
    d = json.loads(r.read())
    return time.time() - t, d["usage"].get("prompt_tokens_details", {}).get("cached_tokens"), d["usage"]["prompt_tokens"], d["choices"][0].get("token_ids")
base = [(i * 7919) % 120000 + 1000 for i in range(1500)]
out = {}
for name, p in [("cold", base), ("same", base), ("extended", base + [(i * 104729) % 120000 + 1000 for i in range(64)])]:
    dt, cached, pt, ids = req(p)
    out[name] = {"seconds": round(dt, 3), "cached_tokens": cached, "prompt_tokens": pt, "ids": ids}
    print(name, json.dumps(out[name]))
json.dump(out, open(sys.argv[2], "w"), indent=1)
