#!/usr/bin/env python3
"""Greedy outputs of one checkpoint split over N GPUs against one GPU (issue 18).

Runs `fathom generate --json` on the same prompt for each split (`1`, `2`, `2,ep`, ...) and compares
the token ids with the one-GPU run. Where a split departs, `fathom score` gives the logits row that
chose the token, from both runs, and the script prints the margin between the two candidates: a
departure is only acceptable where the one-GPU run's top two logits are tied within bf16 rounding.

usage: compare_split_greedy.py FATHOM MODEL [--splits 1 2 2,ep] [--new-tokens 256] [--prompt-len 16]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np


def split_flags(split):
    parts = split.split(",")
    flags = ["--tensor-parallel-size", parts[0]]
    if "ep" in parts[1:]:
        flags.append("--enable-expert-parallel")
    return flags


def generate(fathom, model, prompt, n, split):
    cmd = [fathom, "generate", model, "--device", "cuda", "--token-ids", ",".join(map(str, prompt)),
           "--max-new-tokens", str(n), "--ignore-eos", "--json"] + split_flags(split)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["token_ids"]


def last_row(fathom, model, tokens, split):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "logits.npy")
        cmd = [fathom, "score", model, "--device", "cuda", "--token-ids", ",".join(map(str, tokens)),
               "--logits-out", path] + split_flags(split)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        return np.load(path)[-1].astype(np.float64)


def bf16_ulp(x):
    """The spacing of bf16 numbers at |x| (8 bits of mantissa)."""
    return 2.0 ** (np.floor(np.log2(max(abs(x), 1e-30))) - 7)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fathom")
    ap.add_argument("model")
    ap.add_argument("--splits", nargs="+", default=["1", "2", "2,ep"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=248320, help="prompt ids are drawn below this")
    a = ap.parse_args()
    rng = random.Random(18)
    prompt = [rng.randrange(a.vocab - 1000) for _ in range(a.prompt_len)]
    base = generate(a.fathom, a.model, prompt, a.new_tokens, a.splits[0])
    print(f"{a.splits[0]}: {len(base)} tokens, first 12 {base[:12]}")
    failed = False
    for split in a.splits[1:]:
        out = generate(a.fathom, a.model, prompt, a.new_tokens, split)
        same = next((i for i, (x, y) in enumerate(zip(base, out)) if x != y), None)
        if same is None and len(out) == len(base):
            print(f"{split}: equal to {a.splits[0]}, {len(out)} of {len(base)} tokens")
            continue
        i = same if same is not None else min(len(out), len(base))
        print(f"{split}: departs at generated token {i} ({base[i]} vs {out[i]})")
        ctx = prompt + base[:i]
        ref = last_row(a.fathom, a.model, ctx, a.splits[0])
        got = last_row(a.fathom, a.model, ctx, split)
        t1, t2 = int(base[i]), int(out[i])
        margin = ref[t1] - ref[t2]
        ulp = bf16_ulp(ref[t1])
        print(f"  one-GPU row: logit[{t1}] = {ref[t1]:.6f}, logit[{t2}] = {ref[t2]:.6f}, margin {margin:.3e} "
              f"= {margin / ulp:.2f} bf16 ulp at that size")
        noise = float(np.max(np.abs(ref - got)))
        print(f"  split row:   logit[{t1}] = {got[t1]:.6f}, logit[{t2}] = {got[t2]:.6f}; "
              f"max |diff| over the row {noise:.3e} of spread {ref.max() - ref.min():.3e}")
        # A tie: the margin is within the rounding of one bf16 logit or within what summing in
        # another order moves the row by.
        if margin > max(2 * ulp, noise):
            failed = True
            print("  NOT a tie within bf16 rounding")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
