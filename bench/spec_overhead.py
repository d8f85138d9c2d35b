#!/usr/bin/env python3
"""What speculative decoding costs when its drafts fail: plain against speculative greedy decoding
on a fixture with random weights (acceptance near 0), through `fathom generate --json`.

Runs are interleaved (plain, then each speculative mode, repeated) and the median decode time
of each is reported, with the acceptance and the number of drafts. Used for docs/perf.md:
    python3 bench/spec_overhead.py --fathom build/fathom [--device cuda] [--new-tokens 256]
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(args, extra):
    cmd = [args.fathom, "generate", args.model, "--token-ids", args.prompt, "--max-new-tokens", str(args.new_tokens),
           "--ignore-eos", "--json", "--device", args.device, *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", default="build/fathom")
    ap.add_argument("--model", default="tests/fixtures/qwen35_moe")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--prompt", default="5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20")
    args = ap.parse_args()
    modes = [("plain", [])]
    for k in (1, 3):
        for adaptive in (True, False):
            modes.append((f"mtp K={k}{' adaptive' if adaptive else ' fixed'}",
                          ["--speculative-algorithm", "mtp", "--speculative-num-steps", str(k)] +
                          ([] if adaptive else ["--no-speculative-adaptive"])))
    times = {name: [] for name, _ in modes}
    last = {}
    for _ in range(args.repeats):
        for name, extra in modes:
            r = run(args, extra)
            times[name].append(r["decode_seconds"])
            last[name] = r
    base = statistics.median(times["plain"])
    ref = last["plain"]["token_ids"]
    print(f"{args.model} on {args.device}, {args.new_tokens} new tokens, median of {args.repeats} interleaved runs")
    print("| mode | decode ms | vs plain | acceptance | drafts | target steps | output equal |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for name, _ in modes:
        t = statistics.median(times[name])
        r = last[name]
        spec = r.get("spec", {})
        same = r["token_ids"] == ref
        ok = ok and same
        print(f"| {name} | {t * 1e3:.2f} | {t / base:.3f}x | {spec.get('acceptance_rate', 0):.3f} | "
              f"{spec.get('draft_tokens', 0)} | {r['target_forward_steps']} | {same} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
