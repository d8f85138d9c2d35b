#!/usr/bin/env python3
"""Speculative decoding on real text (issue 16): plain decoding against MTP drafts (K = 1..4) and
n-gram drafts, greedy and sampled, on prompts cut from held-out documents, through
`fathom generate --json` (one process a run; decode time excludes loading and prefill).

For every temperature and prompt the modes run back to back (plain first), `--repeats` times; the
report gives, per mode: decode tokens/s (total tokens over total decode seconds, the median over
repeats), its ratio to plain, acceptance (all drafts, and per draft position), the mean accepted
length (tokens a verification round emits, SGLang's accept length) and, greedy only, whether
every output equals plain decoding's (speculative decoding is lossless).

usage: spec_text.py --fathom BIN --model DIR --heldout FILE [--device cpu|cuda] [--prompts 8]
                    [--prompt-tokens 64] [--new-tokens 128] [--temperatures 0 0.7] [--ks 1 2 3 4]
                    [--repeats 1] [--json-out F]
The model folder's tokenizer.json cuts the prompts (HF tokenizers).
"""
import argparse
import json
import os
import statistics
import subprocess

SEPARATOR = "\n\f\n"


def prompts_from(heldout, tokenizer, count, length):
    """The first `length` tokens of `count` held-out documents spread over the file (documents of
    at least 4 x `length` tokens, so there is text to continue)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    docs = [d for d in open(heldout, encoding="utf-8").read().split(SEPARATOR) if len(d) > 16 * length]
    step = max(1, len(docs) // count)
    out = []
    for d in docs[::step][:count]:
        ids = tok.encode(d, add_special_tokens=False).ids
        if len(ids) >= 4 * length:
            out.append(ids[:length])
    return out, tok


def run(a, prompt, temperature, seed, extra):
    cmd = [a.fathom, "generate", a.model, "--device", a.device, "--token-ids", ",".join(map(str, prompt)),
           "--max-new-tokens", str(a.new_tokens), "--ignore-eos", "--json", "--temperature", str(temperature),
           "--seed", str(seed)] + extra
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])


def modes(ks):
    out = [("plain", [])]
    for k in ks:
        out.append((f"mtp K={k}", ["--speculative-algorithm", "mtp", "--speculative-num-steps", str(k),
                                   "--no-speculative-adaptive"]))
    out.append(("ngram K=3", ["--speculative-algorithm", "ngram", "--speculative-num-steps", "3",
                              "--no-speculative-adaptive"]))
    return out


def add_text_args(ap, device, prompts, repeats):
    """The arguments of a run over held-out prompts (this script's and spec_serve.py's)."""
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--device", default=device)
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--repeats", type=int, default=repeats)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_text_args(ap, device="cpu", prompts=8, repeats=1)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--json-out")
    a = ap.parse_args()
    prompts, tok = prompts_from(a.heldout, os.path.join(a.model, "tokenizer.json"), a.prompts, a.prompt_tokens)
    ms = modes(a.ks)
    report = {"device": a.device, "prompts": len(prompts), "prompt_tokens": a.prompt_tokens,
              "new_tokens": a.new_tokens, "repeats": a.repeats, "results": []}
    lossy = []  # greedy modes whose outputs differ from plain decoding
    print(f"{a.model} on {a.device}: {len(prompts)} held-out prompts of {a.prompt_tokens} tokens, "
          f"{a.new_tokens} new tokens each, {a.repeats} repeat(s)")
    for temp in a.temperatures:
        # per mode: tokens/s of each repeat, and the speculative counters summed over prompts
        rates = {name: [] for name, _ in ms}
        counts = {name: {"drafted_at": [], "accepted_at": [], "draft_tokens": 0, "accepted": 0, "rounds": 0,
                         "steps": 0} for name, _ in ms}
        equal = {name: True for name, _ in ms}
        sample_text = None
        for rep in range(a.repeats):
            tokens = {name: 0 for name, _ in ms}
            seconds = {name: 0.0 for name, _ in ms}
            for i, p in enumerate(prompts):
                plain = None
                for name, extra in ms:
                    r = run(a, p, temp, 1000 + i, extra)
                    tokens[name] += len(r["token_ids"])
                    seconds[name] += r["decode_seconds"]
                    if name == "plain":
                        plain = r["token_ids"]
                        if sample_text is None:
                            sample_text = (tok.decode(p), tok.decode(plain))
                    elif temp == 0 and r["token_ids"] != plain:
                        equal[name] = False
                    if rep == 0 and "spec" in r:
                        c, s = counts[name], r["spec"]
                        for key in ("drafted_at", "accepted_at"):
                            v = s.get(key, [])
                            c[key] += [0] * (len(v) - len(c[key]))
                            for j, x in enumerate(v):
                                c[key][j] += x
                        c["draft_tokens"] += s["draft_tokens"]
                        c["accepted"] += s["accepted_tokens"]
                        c["rounds"] += s.get("draft_rounds", s["steps"])
                        c["steps"] += s["steps"]
            for name, _ in ms:
                rates[name].append(tokens[name] / max(1e-9, seconds[name]))
        base = statistics.median(rates["plain"])
        print(f"\ntemperature {temp}:" + (f" first prompt {sample_text[0]!r} -> {sample_text[1]!r}" if sample_text else ""))
        print("| mode | decode tok/s | vs plain | acceptance | per position | accept length | outputs |")
        print("|---|---|---|---|---|---|---|")
        for name, _ in ms:
            rate = statistics.median(rates[name])
            c = counts[name]
            row = {"temperature": temp, "mode": name, "tok_s": rate, "speedup": rate / base}
            if name == "plain":
                print(f"| plain | {rate:.1f} | 1.00x | - | - | 1.00 | - |")
            else:
                acc = c["accepted"] / max(1, c["draft_tokens"])
                pos = [x / y if y else 0.0 for x, y in zip(c["accepted_at"], c["drafted_at"])]
                length = (c["accepted"] + c["rounds"]) / max(1, c["rounds"])
                out = ("equal plain" if equal[name] else "DIFFER") if temp == 0 else "sampled"
                if temp == 0 and not equal[name]:
                    lossy.append(name)
                print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {acc:.3f} | "
                      f"{' / '.join(f'{x:.2f}' for x in pos)} | {length:.2f} | {out} |")
                row.update(acceptance=acc, by_position=pos, accept_length=length, drafts=c["draft_tokens"],
                           outputs_equal_plain=equal[name] if temp == 0 else None)
            report["results"].append(row)
    if a.json_out:
        json.dump(report, open(a.json_out, "w"), indent=1)
    return 1 if lossy else 0


if __name__ == "__main__":
    raise SystemExit(main())
