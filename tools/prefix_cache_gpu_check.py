"""Prefix caching through `fathom serve` (issue 20): two servers of one model, caching on and off
(--no-enable-prefix-caching), the same greedy requests one after another: prompts sharing a long
prefix with the first (none, part of it, all of it, all but the last token), then a chat of
several turns (each prompt the conversation so far plus a new message), then a burst of requests
sent at once that share a new long prefix (the server prefills it once, the others wait for its
snapshot). The completions must be equal token for token, and the cached server must report hits.

usage: python3 tools/prefix_cache_gpu_check.py --fathom BIN --model DIR [serve flags...]
"""
import argparse
import concurrent.futures
import json
import os
import sys
import tempfile

import serve_proc


def run(fathom, model, flags, env, log_path):
    with serve_proc.serving(fathom, model, flags, env, log_path) as port:
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
        # The burst: its requests share a step with each other, so on the GPU their greedy tokens can
        # differ from a server that batched them otherwise where two tokens nearly tie (matrix
        # products are not batch-invariant); each keeps its logprobs to tell that from a wrong state.
        burst_base = ("In the mountains the monastery kept a library of maps, letters and ledgers, copied "
                      "by hand each winter and carried down to the valley towns in spring. ") * 8
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            burst = list(pool.map(
                lambda q: serve_proc.greedy_logprobs(port, burst_base + f"Question {q}: what was copied?", 24),
                range(6)))
        metrics = serve_proc.get_text(port, "/metrics")
        def counter(name):
            v = [float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines() if l.startswith("fathom:" + name)]
            return v[0] if v else None
        tiers = {k: counter(k) for k in ("prefix_cache_offloaded_snapshots_total",
                                         "prefix_cache_onloaded_snapshots_total", "external_prefix_cache_hits_total")}
        return outs, burst, counter("prefix_cache_hits_total"), tiers


def compare_burst(cached, plain, tie=0.1):
    """Per request: "equal", "near tie at i (gap g)" where the first differing token was within `tie`
    nats of the plain server's choice there, else "differs at i (gap g)"."""
    verdicts = []
    for (ct, _), (pt, ptop) in zip(cached, plain):
        i = next((k for k, (a, b) in enumerate(zip(ct, pt)) if a != b), None)
        if i is None:
            verdicts.append("equal" if len(ct) == len(pt) else "differs in length")
            continue
        gap = ptop[i][pt[i]] - ptop[i].get(ct[i], float("-inf"))
        verdicts.append(f"{'near tie' if gap < tie else 'differs'} at {i} (gap {gap:.3f})")
    return verdicts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    a, flags = ap.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp)
        cached, cached_burst, hits, tiers = run(a.fathom, a.model, flags, env, tmp + "/on.log")
        log_on = open(tmp + "/on.log").read()
        plain, plain_burst, no_hits, _ = run(a.fathom, a.model, flags + ["--no-enable-prefix-caching"], env, tmp + "/off.log")
    same = sum(x == y for x, y in zip(cached, plain))
    burst = compare_burst(cached_burst, plain_burst)
    print(json.dumps({"equal_completions": f"{same}/{len(plain)}", "burst": burst, "prefix_cache_hits_total": hits,
                      "host_tier": tiers,
                      "off_server_reports_hits": no_hits is not None,
                      "caching_line": [l for l in log_on.splitlines() if "prefix caching" in l][:1]}))
    for i, (x, y) in enumerate(zip(cached, plain)):
        if x != y:
            print(f"request {i}: cached {x!r} vs plain {y!r}")
    burst_ok = all(v == "equal" or v.startswith("near tie") for v in burst)
    return 0 if same == len(plain) and burst_ok and hits and hits > 0 and no_hits is None else 1


if __name__ == "__main__":
    sys.exit(main())
