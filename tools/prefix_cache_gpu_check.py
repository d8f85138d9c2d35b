"""Prefix caching through `fathom serve` (issue 20): two servers of one model, caching on and off
(--no-enable-prefix-caching), the same greedy requests one after another: prompts sharing a long
prefix with the first (none, part of it, all of it, all but the last token), then a chat of
several turns (each prompt the conversation so far plus a new message). The completions must be
equal token for token, and the cached server must report hits.

usage: python3 tools/prefix_cache_gpu_check.py --fathom BIN --model DIR [serve flags...]
"""
import argparse
import json
import os
import sys
import tempfile

import serve_proc


def run(fathom, model, flags, env, log_path):
    p, port = serve_proc.start(fathom, model, flags, env, log_path)
    assert port, open(log_path).read()[-3000:]
    try:
        def complete(prompt, n=32):
            c = serve_proc.post(port, "/v1/completions",
                                {"prompt": prompt, "max_tokens": n, "temperature": 0, "return_token_ids": True})
            return c["choices"][0]["text"]
        base = ("The history of the city begins with a small settlement by the river, where traders "
                "met to exchange salt, grain and cloth. Over the centuries the market grew, walls were "
                "built, and the town became a center of crafts and learning. ") * 6
        outs = [complete(p) for p in [base + "Question: who built the walls?",
                                      base[:200] + "Something else entirely.",
                                      "An unrelated prompt about the sea and its tides.",
                                      base + "Question: what was traded?",
                                      base,
                                      base + "Question: who built the walls?"]]
        conversation = "User: tell me about the river town.\nAssistant:"
        for turn in range(5):
            answer = complete(conversation, 40)
            outs.append(answer)
            conversation += answer + f"\nUser: and then what happened, part {turn}?\nAssistant:"
        metrics = serve_proc.get_text(port, "/metrics")
        hits = [float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith("fathom:prefix_cache_hits_total")]
        return outs, hits[0] if hits else None
    finally:
        serve_proc.stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    a, flags = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp)
        cached, hits = run(a.fathom, a.model, flags, env, tmp + "/on.log")
        log_on = open(tmp + "/on.log").read()
        plain, no_hits = run(a.fathom, a.model, flags + ["--no-enable-prefix-caching"], env, tmp + "/off.log")
    same = sum(x == y for x, y in zip(cached, plain))
    print(json.dumps({"equal_completions": f"{same}/{len(plain)}", "prefix_cache_hits_total": hits,
                      "off_server_reports_hits": no_hits is not None,
                      "caching_line": [l for l in log_on.splitlines() if "prefix caching" in l][:1]}))
    for i, (x, y) in enumerate(zip(cached, plain)):
        if x != y:
            print(f"request {i}: cached {x!r} vs plain {y!r}")
    return 0 if same == len(plain) and hits and hits > 0 and no_hits is None else 1


if __name__ == "__main__":
    sys.exit(main())
