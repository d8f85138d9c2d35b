#!/usr/bin/env python3
"""Checks a running `fathom serve` on a real-size model (GPU machine; standard library only):
/v1/models, a chat answer in text, a long prompt with a long completion, and a prompt past the
context limit (400 naming both numbers) while another request completes.

usage: serve_check.py --url http://127.0.0.1:8000 [--long-prompt 32768] [--long-output 256]
"""
import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request


def call(url, path, body=None, timeout=600):
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--long-prompt", type=int, default=32768)
    ap.add_argument("--long-output", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=150000, help="token ids drawn below this")
    a = ap.parse_args()
    failed = 0
    code, models = call(a.url, "/v1/models")
    model = models["data"][0]
    limit = model["max_model_len"]
    print(f"model {model['id']}: max_model_len {limit}")

    t0 = time.time()
    code, r = call(a.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello! Who are you?"}],
                                                    "max_tokens": 24, "temperature": 0})
    text = r["choices"][0]["message"]["content"] if code == 200 else None
    ok = code == 200 and isinstance(text, str) and text != ""
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'} chat: {code} in {time.time() - t0:.2f} s, text {text!r}")

    rng = random.Random(1)
    prompt = [rng.randrange(10, a.vocab) for _ in range(a.long_prompt)]
    t0 = time.time()
    code, r = call(a.url, "/v1/completions", {"prompt": prompt, "max_tokens": a.long_output, "temperature": 0,
                                              "ignore_eos": True})
    secs = time.time() - t0
    usage = r.get("usage", {})
    ok = code == 200 and usage.get("prompt_tokens") == a.long_prompt and usage.get("completion_tokens") == a.long_output
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'} {a.long_prompt}-token prompt + {a.long_output} tokens: {code} in {secs:.1f} s, "
          f"usage {usage}, error {r.get('error')}")

    # Past the limit: 400 naming both numbers, and a request running beside it is unaffected.
    side = {}
    th = threading.Thread(target=lambda: side.update(r=call(a.url, "/v1/completions", {
        "prompt": prompt[:512], "max_tokens": 64, "temperature": 0, "ignore_eos": True})))
    th.start()
    over = [rng.randrange(10, a.vocab) for _ in range(limit + 1)]
    code, r = call(a.url, "/v1/completions", {"prompt": over, "max_tokens": 8})
    th.join()
    msg = r.get("error", {}).get("message", "")
    ok = code == 400 and str(limit) in msg and str(limit + 1) in msg
    side_code, side_r = side["r"]
    ok_side = side_code == 200 and side_r["usage"]["completion_tokens"] == 64
    failed += int(not ok) + int(not ok_side)
    print(f"{'PASS' if ok else 'FAIL'} prompt of {limit + 1} tokens: {code} {msg!r}")
    print(f"{'PASS' if ok_side else 'FAIL'} a request beside it: {side_code}")
    print(f"{4 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
