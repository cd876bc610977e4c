#!/usr/bin/env python3
"""Checks a tandem server on the GPU (scripts/gpu-suite.sh):

    gpu-serve-check.py URL STATUS_OUT [--wait-only]

Waits up to 300 s for URL's /health to answer 200 (the model loaded:
/v1/models answers while it loads); then (unless --wait-only)
saves /v1/status to STATUS_OUT and checks that it names a cuda device, and
that one seeded sampled request (temperature, top-p, top-k, a repetition
penalty: every device-sampling path) gives the same text twice and a
different seed a valid answer. Exit status 1 on any failure, with the reason
printed. Standard library only (the GPU machine has python3, nothing more
is assumed)."""
import json
import sys
import time
import urllib.request


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def main():
    url, status_out = sys.argv[1], sys.argv[2]
    deadline = time.time() + 300
    while True:
        try:
            get(url + "/health")
            break
        except Exception as e:  # not up yet
            if time.time() > deadline:
                print(f"server at {url} did not come up: {e}")
                return 1
            time.sleep(1)
    if "--wait-only" in sys.argv:
        return 0
    status = get(url + "/v1/status")
    with open(status_out, "w") as f:
        json.dump(status, f, indent=1)
    print("status:", json.dumps({k: status.get(k) for k in ("device", "gpu_memory")}))
    if not str(status.get("device", "")).startswith("cuda"):
        print("FAIL: /v1/status does not report a cuda device")
        return 1
    model = get(url + "/v1/models")["data"][0]["id"]

    def ask(seed):
        body = {"model": model, "seed": seed, "max_tokens": 40, "temperature": 0.9,
                "top_p": 0.95, "top_k": 50, "repetition_penalty": 1.1,
                "messages": [{"role": "user", "content": "Tell me about the sea."}]}
        return post(url + "/v1/chat/completions", body)["choices"][0]["message"]["content"]

    a, b, c = ask(7), ask(7), ask(8)
    print("seed 7:", repr(a))
    print("seed 7 again:", repr(b))
    print("seed 8:", repr(c))
    if a != b or not a:
        print("FAIL: the same seed gave different (or empty) text")
        return 1
    print("ok: seeded device sampling repeats itself")
    return 0


if __name__ == "__main__":
    sys.exit(main())
