#!/usr/bin/env python3
"""What a sampled MTP draft would be accepted at, against the argmax draft the engine sends now
(issue 34's temperature 0.7 row). Offline: no server, one `fathom generate` and one `fathom score`
per prompt.

For each held-out prompt the model continues it at the temperature (seeded), then `fathom score
--mtp-logits-out` gives, at every generated position, the model's logits p and the MTP layer's q
for the same token. With p_T and q_T the softmax at temperature T (no top-k / top-p), lossless
speculative sampling accepts one draft with probability:
  - argmax draft (what the engine does: the MTP layer's argmax d, verified by sampling from p_T):
    p_T(d), d = argmax q;
  - sampled draft (d drawn from q_T, accepted with min(1, p_T(d) / q_T(d)), else a draw from the
    residual max(0, p_T - q_T)): sum_x min(p_T(x), q_T(x)) = 1 - TV(p_T, q_T).
Also the greedy agreement (argmax q == argmax p): at temperature 0 (greedy continuations) the
greedy row's acceptance. The
positions are the model's own samples, as served requests are.

usage: mtp_draft_acceptance.py --fathom BIN --model DIR --heldout FILE [--prompts 6]
                               [--prompt-tokens 64] [--new-tokens 128] [--temperatures 0.7 1.0]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_text import prompts_from  # noqa: E402


def softmax(x, t):
    z = x / t
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def continuation(a, prompt, temperature, seed):
    cmd = [a.fathom, "generate", a.model, "--device", a.device, "--token-ids", ",".join(map(str, prompt)),
           "--max-new-tokens", str(a.new_tokens), "--ignore-eos", "--json", "--temperature", str(temperature),
           "--seed", str(seed)]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    return out["token_ids"]


def score(a, ids, tmp):
    main, mtp = os.path.join(tmp, "main.npy"), os.path.join(tmp, "mtp.npy")
    subprocess.run([a.fathom, "score", a.model, "--device", a.device, "--token-ids", ",".join(map(str, ids)),
                    "--logits-out", main, "--mtp-logits-out", mtp], check=True, capture_output=True)
    return np.load(main), np.load(mtp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7])
    a = ap.parse_args()
    prompts, _ = prompts_from(a.heldout, os.path.join(a.model, "tokenizer.json"), a.prompts, a.prompt_tokens)
    print(f"{len(prompts)} prompts of {a.prompt_tokens} tokens, {a.new_tokens} sampled tokens each, "
          f"per-draft acceptance over the generated positions")
    with tempfile.TemporaryDirectory() as tmp:
        for temp in a.temperatures:
            greedy, argmax_draft, sampled_draft, n = 0.0, 0.0, 0.0, 0
            for i, prompt in enumerate(prompts):
                gen = continuation(a, prompt, temp, seed=1000 + i)
                ids = list(prompt) + list(gen)
                main_logits, mtp_logits = score(a, ids, tmp)
                # MTP row t and main row t + 1 both predict token t + 2; rows whose token is generated.
                rows = range(len(prompt) - 2, len(ids) - 2)
                q_raw = mtp_logits[list(rows)]
                p_raw = main_logits[[t + 1 for t in rows]]
                d = q_raw.argmax(axis=-1)
                greedy += float((d == p_raw.argmax(axis=-1)).sum())
                n += len(d)
                if temp > 0:
                    p, q = softmax(p_raw, temp), softmax(q_raw, temp)
                    argmax_draft += float(p[np.arange(len(d)), d].sum())
                    sampled_draft += float(np.minimum(p, q).sum(axis=-1).sum())
            line = f"temperature {temp}: {n} positions; argmax of q equals argmax of p {greedy / n:.3f}"
            if temp > 0:
                line += f"; argmax draft accepted {argmax_draft / n:.3f}; sampled draft accepted {sampled_draft / n:.3f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
