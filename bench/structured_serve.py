#!/usr/bin/env python3
"""Serving throughput with structured output against without (issue 17): the same prompts at the
same concurrency through a running `fathom serve`, first unconstrained (ignore_eos, max_tokens),
then each request under a JSON schema (sixty short strings), alternated --repeats times. Prints
output tokens/s of each run, the medians and their ratio, and checks every constrained output
against the schema with `jsonschema` (where it is installed; else parses it).

usage: bench/structured_serve.py --url http://127.0.0.1:8000 [--concurrency 16] [--requests 64]
                                 [--max-tokens 256] [--repeats 3]
"""
import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import requests

try:
    import jsonschema
except ImportError:  # the GPU machine has no jsonschema: outputs are then only parsed
    jsonschema = None

# Sixty short strings: constrained outputs as long as the plain ones (about 200 tokens), so both
# runs measure decoding rather than request overheads.
SCHEMA = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "minItems": 60, "maxItems": 60}
PROMPTS = ["Write a list of names of places by the sea.", "List the things a king owns.",
           "Name the books of the law.", "Give me words about the morning."]


def run(url, model, concurrency, n, max_tokens, schema):
    def one(i):
        body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "max_tokens": max_tokens, "temperature": 0.7, "seed": i}
        if schema:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "list", "schema": schema}}
        else:
            body["ignore_eos"] = True
        r = requests.post(url + "/v1/chat/completions", json=body, timeout=600).json()
        c = r["choices"][0]
        if schema and c["finish_reason"] == "stop":
            value = json.loads(c["message"]["content"])
            if jsonschema:
                jsonschema.validate(value, schema)
        return r["usage"]["completion_tokens"]
    t0 = time.time()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, range(n)))
    return tokens / (time.time() - t0), tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = requests.get(a.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    run(a.url, model, a.concurrency, a.concurrency, 16, None)  # warm-up
    plain, constrained = [], []
    for rep in range(a.repeats):
        for name, schema, out in (("plain", None, plain), ("json_schema", SCHEMA, constrained)):
            rate, tokens = run(a.url, model, a.concurrency, a.requests, a.max_tokens, schema)
            out.append(rate)
            print(f"run {rep + 1} {name:12s}: {tokens} tokens, {rate:.1f} tok/s", flush=True)
    p, c = statistics.median(plain), statistics.median(constrained)
    print(f"median: plain {p:.1f} tok/s, json_schema {c:.1f} tok/s = {c / p:.2f}x "
          f"(concurrency {a.concurrency}, {a.requests} requests, max_tokens {a.max_tokens})")


if __name__ == "__main__":
    main()
