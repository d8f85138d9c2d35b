#!/usr/bin/env python3
"""Speculative decoding as a user of the server gets it (issue 34): `fathom serve` plain against
MTP drafts, one request at a time, on prompts cut from held-out documents.

Each mode is one server process (the same flags otherwise); every pass sends each prompt as a
`/v1/completions` request (token ids, `ignore_eos`, `--new-tokens` tokens, seeded when sampled) and
waits for it before the next (with --concurrency C, C clients do so at once). tok/s = completion tokens over the requests' wall time at the client
(prefill, HTTP and decode: what a user sees), the median over `--repeats` passes. Greedy outputs
must equal plain decoding's one request at a time; with several at once a step's batch may change
a near-tied greedy choice (the GEMMs past the batch-invariant GEMV sizes), so the report counts
the outputs that differ and the passes of one mode that differ from its first. The acceptance and
the fused rounds come from the server's /metrics.

Modes: plain; mtp1 (one draft a round, fused rounds on greedy steps); mtp1-unfused (the same with
FATHOM_FUSED_MTP=0: a draft step and a verify step a round); mtp1-unchained (fused rounds, each
read before the next is launched: FATHOM_CHAINED_ROUNDS=0); mtp1-limit2 (mtp1 with
--speculative-disable-by-batch-size 2: overlapped plain steps from two decoding sequences on);
mtp1-auto (the limit chosen from the measured rates, spec_batch_limit.h); mtp1-off (the MTP
layer loaded and the speculator on, drafting off at any batch: --speculative-disable-by-batch-size
1, what MTP costs a server that never drafts); mtp1-drawn (mtp1 with --speculative-sampled-drafts:
sampled requests' drafts drawn from the MTP layer's distribution); mtp2, mtp3; plain-again
(plain's server a second time: beside --interleave, the paired ratio of two identical servers).
--serve-flag adds a flag to every server (the CPU engine's runner-side sampling:
--serve-flag=--sampler --serve-flag=device).

--interleave starts every mode's server at once (on CUDA the index-th of n with (index + 1) / n
of 0.85 as its memory share: server_args) and alternates their passes, the order rotated each
repeat: a drift of the machine's speed then reaches every mode alike, and repeat i of a mode and
of plain give a paired ratio; the report adds the median of those ratios and their range (the
check that a mode is never slower than plain, which unpaired medians of passes 5% apart cannot
show).

usage: spec_serve.py --fathom BIN --model DIR --heldout FILE [--device cuda] [--prompts 6]
                     [--prompt-tokens 64] [--new-tokens 128] [--temperatures 0 0.7] [--repeats 3]
                     [--concurrency 1]
                     [--modes plain mtp1 mtp1-unfused] [--serve-flag F ...] [--log-dir DIR] [--json-out F]
                     [--interleave]
"""
import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import serve_proc  # noqa: E402
from spec_text import add_text_args, prompts_from  # noqa: E402

MODES = {
    "plain": ([], {}),
    # plain's server a second time: with --interleave, what two identical servers differ by.
    "plain-again": ([], {}),
    "mtp1": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive"], {}),
    "mtp1-unfused": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive"],
                     {"FATHOM_FUSED_MTP": "0"}),
    "mtp1-unchained": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive"],
                       {"FATHOM_CHAINED_ROUNDS": "0"}),
    # One draft a round below 2 decoding sequences; from 2 on, overlapped plain steps.
    "mtp1-limit2": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive",
                     "--speculative-disable-by-batch-size", "2"], {}),
    # The same with the limit chosen from measured rates.
    "mtp1-auto": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive",
                   "--speculative-disable-by-batch-size", "auto"], {}),
    # Loaded, never drafting: what the MTP configuration costs by itself.
    "mtp1-off": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive",
                  "--speculative-disable-by-batch-size", "1"], {}),
    # Sampled requests' drafts drawn from the MTP layer's distribution, verified with min(1, p/q).
    "mtp1-drawn": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "1", "--no-speculative-adaptive",
                    "--speculative-sampled-drafts"], {}),
    "mtp2": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "2", "--no-speculative-adaptive"], {}),
    "mtp3": (["--speculative-algorithm", "mtp", "--speculative-num-steps", "3", "--no-speculative-adaptive"], {}),
}


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def request(a, prompt, temp, i):
    return {"prompt": prompt, "max_tokens": a.new_tokens, "temperature": temp, "ignore_eos": True, "seed": 1000 + i}


def one_pass(a, port, prompts, temp):
    """One pass of every prompt through the server on `port`: (completion tok/s, output texts)."""
    if a.concurrency == 1:
        tokens, seconds, texts = 0, 0.0, []
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            r = serve_proc.post(port, "/v1/completions", request(a, p, temp, i))
            seconds += time.perf_counter() - t0
            tokens += r["usage"]["completion_tokens"]
            texts.append(r["choices"][0]["text"])
        return tokens / seconds, texts
    # `concurrency` clients, each sending the prompts in turn, `concurrency` x prompts in all
    jobs = [(c, i) for c in range(a.concurrency) for i in range(len(prompts))]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
        outs = list(pool.map(lambda j: serve_proc.post(port, "/v1/completions", request(a, prompts[j[1]], temp, j[1])),
                             jobs))
    seconds = time.perf_counter() - t0
    return sum(r["usage"]["completion_tokens"] for r in outs) / seconds, [r["choices"][0]["text"] for r in outs]


def add_pass(out, temp, rate, texts):
    r = out.setdefault(temp, {"passes": [], "texts": None, "unstable": 0})
    r["passes"].append(rate)
    if r["texts"] is None:
        r["texts"] = texts
    elif texts != r["texts"]:  # batch composition changed a greedy choice (a near tie)
        r["unstable"] += 1
    r["tok_s"] = statistics.median(r["passes"])


def spec_metrics(port):
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {k: metric(m, "fathom:" + k) for k in (
        "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
        "spec_decode_fused_rounds_total", "spec_decode_chained_rounds_total", "spec_decode_mean_accepted_length",
        "spec_decode_waiting_steps_total", "spec_decode_batch_limit")}


def server_args(a, mode, index, count):
    """A mode's server flags and environment. The index-th of `count` servers up at once on one
    GPU gets (index + 1) / count of 0.85 as --gpu-memory-utilization: the flag's share counts the
    memory the servers started before it already hold, so each gets 0.85 / count for itself."""
    flags, env_extra = MODES[mode]
    extra = []
    if count > 1 and a.device == "cuda":
        extra = ["--gpu-memory-utilization", f"{0.85 * (index + 1) / count:.3f}"]
    return ["--device", a.device, *a.serve_flag, *extra, *flags], dict(os.environ, **env_extra)


def run_modes(a, modes, prompts):
    """The passes of `modes`, their servers up at once; with several, the passes alternate (the
    order rotated each repeat), so that a drift of the machine's speed reaches every mode alike
    and each repeat gives a paired ratio against plain."""
    results = {m: {} for m in modes}
    with contextlib.ExitStack() as stack:
        ports = {}
        for index, mode in enumerate(modes):  # one after another: each sees the memory of those before
            args, env = server_args(a, mode, index, len(modes))
            ports[mode] = stack.enter_context(
                serve_proc.serving(a.fathom, a.model, args, env, os.path.join(a.log_dir, f"serve_{mode}.log")))
            serve_proc.post(ports[mode], "/v1/completions", {"prompt": prompts[0], "max_tokens": 8, "temperature": 0})
        for temp in a.temperatures:
            for rep in range(a.repeats):
                k = rep % len(modes)
                for mode in modes[k:] + modes[:k]:
                    add_pass(results[mode], temp, *one_pass(a, ports[mode], prompts, temp))
        for mode in modes:
            results[mode]["metrics"] = spec_metrics(ports[mode])
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_args(ap, device="cuda", prompts=6, repeats=3)
    ap.add_argument("--concurrency", type=int, default=1,
                    help="clients at once, each sending every prompt (tok/s over the pass's wall time)")
    ap.add_argument("--modes", nargs="+", default=["plain", "mtp1", "mtp1-unfused"])
    ap.add_argument("--serve-flag", action="append", default=[], help="a flag for every server (repeatable)")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--json-out")
    ap.add_argument("--interleave", action="store_true",
                    help="all servers up at once, passes alternated: each repeat's ratio to plain is paired")
    a = ap.parse_args()
    os.makedirs(a.log_dir, exist_ok=True)  # the servers' logs go there
    prompts, _ = prompts_from(a.heldout, os.path.join(a.model, "tokenizer.json"), a.prompts, a.prompt_tokens)
    if a.interleave:
        results = run_modes(a, a.modes, prompts)
    else:  # each mode's server up for its own passes alone
        results = {mode: run_modes(a, [mode], prompts)[mode] for mode in a.modes}
    base = results.get("plain")
    print(f"{len(prompts)} prompts of {a.prompt_tokens} tokens, {a.new_tokens} new tokens, "
          f"{'one request at a time' if a.concurrency == 1 else f'{a.concurrency} clients at once'}, "
          f"medians of {a.repeats} passes{' (interleaved: paired ratios to plain)' if a.interleave else ''}")
    lossless = True
    for temp in a.temperatures:
        print(f"temperature {temp}:")
        for mode, r in results.items():
            rate = r[temp]["tok_s"]
            line = f"  {mode:13s} {rate:9.1f} tok/s"
            if base:
                line += f"  {rate / base[temp]['tok_s']:.3f}x"
            line += f"  passes {[round(x, 1) for x in r[temp]['passes']]}"
            if a.interleave and base and mode != "plain":  # repeat i of each mode ran side by side
                paired = sorted(x / y for x, y in zip(r[temp]["passes"], base[temp]["passes"]))
                line += f"  paired {statistics.median(paired):.3f}x [{paired[0]:.3f}, {paired[-1]:.3f}]"
            met = r["metrics"]
            drafts = met["spec_decode_num_draft_tokens_total"]
            if not mode.startswith("plain"):
                acc = met["spec_decode_num_accepted_tokens_total"] / drafts if drafts else 0.0
                line += (f"  acceptance {acc:.3f} (whole run), fused rounds {met['spec_decode_fused_rounds_total']:.0f}"
                         f" ({met['spec_decode_chained_rounds_total']:.0f} chained), waiting steps "
                         f"{met['spec_decode_waiting_steps_total']:.0f}, batch limit {met['spec_decode_batch_limit']:.0f}")
            if temp == 0 and base and mode != "plain":
                differ = sum(x != y for x, y in zip(r[temp]["texts"], base[temp]["texts"]))
                lossless = lossless and (differ == 0 or a.concurrency > 1)
                line += "  outputs equal plain" if differ == 0 else f"  {differ} of {len(r[temp]['texts'])} outputs differ"
            if temp == 0 and r[temp]["unstable"]:
                line += f"  ({r[temp]['unstable']} passes differ from its first)"
            print(line)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({m: {str(k): v for k, v in r.items()} for m, r in results.items()}, f, indent=1)
    return 0 if lossless else 1

if __name__ == "__main__":
    sys.exit(main())
