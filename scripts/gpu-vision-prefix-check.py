#!/usr/bin/env python3
"""The prefix cache on the vision lane through a tandem server
(scripts/gpu-suite.sh runs it against the built-in demo model on CUDA):

    gpu-vision-prefix-check.py URL OUT.json

Asks one question about an image (the first case of
coherence/demo-vision.json), then another question about the same image:
with the prefix cache on, the second request may reuse the blocks up to its
question, so the cached prefix can end inside the image's soft tokens. Each
answer is greedy with logprobs; OUT.json gets the texts, cached_tokens and
prompt_tokens. Run it against a server with the cache and one with
--no-prefix-cache: the second answers must be the same text and logprobs
within 1e-2 (the suite compares them and says why not closer). Standard library only."""
import json
import sys
import urllib.request

url, out_path = sys.argv[1], sys.argv[2]
case = json.load(open("coherence/demo-vision.json"))["cases"][0]
image = next(c for c in case["messages"][0]["content"] if c["type"] == "image_url")


def ask(question):
    body = {"messages": [{"role": "user", "content": [image, {"type": "text", "text": question}]}],
            "max_tokens": 12, "temperature": 0, "logprobs": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        d = json.loads(r.read())
    choice = d["choices"][0]
    return {"text": choice["message"]["content"],
            "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
            "prompt_tokens": d["usage"]["prompt_tokens"],
            "cached_tokens": d["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)}


result = {"first": ask("What shape is in the image?"),
          "second": ask("What colour is the shape in the image?")}
for name, r in result.items():
    print(name, json.dumps(r))
json.dump(result, open(out_path, "w"), indent=1)
