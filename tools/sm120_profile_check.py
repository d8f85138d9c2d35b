"""The SM120 profile against the normal engine on the GPU (issue 19): `fathom serve` runs of one
model (normal; FATHOM_SM120_PROFILE=1: only kernels within SM120's 99 KB of shared memory, so the
recurrent delta rule replaces the chunked one in prefill; and normal with the chunked form off,
FATHOM_GDN_CHUNKED=0, the kernels the profile chooses), the same greedy requests (random token
prompts long enough for the prefill kernels), and the comparisons: the profile must equal the
normal engine on the same kernels bit for bit (the profile changes which kernels run, nothing
else); against the normal engine, the first tokens and the largest difference of the top-5
logprobs at the positions both generated alike, beside their spread (on random weights the top
tokens are close, so the chunked form's tf32 rounding can swap them).

usage: python3 tools/sm120_profile_check.py --fathom BIN --model CONFIG_OR_DIR [serve flags...]
"""
import argparse
import json
import os
import random
import sys
import tempfile

import serve_proc


def run(fathom, model, flags, env, prompts, log_path):
    with serve_proc.serving(fathom, model, flags, env, log_path) as port:
        return [serve_proc.greedy_logprobs(port, q, 8) for q in prompts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--vocab", type=int, default=248320)
    a, flags = ap.parse_known_args()
    rng = random.Random(7)
    prompts = [[rng.randrange(a.vocab) for _ in range(n)] for n in (300, 1000, 2000)]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_CACHE_HOME=tmp)
        normal = run(a.fathom, a.model, flags, env, prompts, tmp + "/normal.log")
        profile = run(a.fathom, a.model, flags, dict(env, FATHOM_SM120_PROFILE="1"), prompts, tmp + "/sm120.log")
        same_kernels = run(a.fathom, a.model, flags, dict(env, FATHOM_GDN_CHUNKED="0"), prompts, tmp + "/recurrent.log")
        rejected = [l.strip() for l in open(tmp + "/sm120.log") if "rejected" in l]
    identical = profile == same_kernels
    worst, spread, first_equal, positions = 0.0, 0.0, 0, 0
    for (tn, topn), (tp, topp) in zip(normal, profile):
        first_equal += tn[0] == tp[0]
        for i in range(min(len(tn), len(tp))):
            if tn[:i + 1] != tp[:i + 1]:
                break
            positions += 1
            for k, v in topn[i].items():
                if k in topp[i]:
                    worst = max(worst, abs(v - topp[i][k]))
            vals = list(topn[i].values())
            spread = max(spread, max(vals) - min(vals))
    print(json.dumps({"profile_equals_same_kernels_bitwise": identical,
                      "vs_normal": {"first_tokens_equal": f"{first_equal}/{len(prompts)}", "positions_compared": positions,
                                    "max_top5_logprob_diff": worst, "max_top5_spread": spread},
                      "profile_rejected": rejected}))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
