#!/usr/bin/env python3
"""Compares `fathom tokenize --input-json` with HF `tokenizers` on a random sample.

The sample (a fixed seed by default, --seed N for another one) takes corpus strings, random
slices of them and random concatenations, and encodes them with and without special tokens for
Qwen3, Llama 3, DeepSeek V3, the default model's own (FIXTURES_DIR/tokenizers; fathom_default is
made by tools/train_default_tokenizer.py) and the Qwen3.5-regex variant of Qwen3.
Prints 'N passed, M failed'; exit 0 when all agree, 1 on any mismatch or when `tokenizers` is not
importable (scripts/install_deps.sh installs it into .venv).
Usage: test_tokenizer_vs_hf.py --fathom BIN --fixtures FIXTURES_DIR [--seed N]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

SEED = 20250611  # fixed so that a run is reproducible; --seed N samples another set


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        print(f"FAIL: the reference package `tokenizers` is not importable by {sys.executable} ({e}); "
              "scripts/install_deps.sh installs it into .venv")
        print("0 passed, 1 failed")
        return 1
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    from make_tokenizer_corpus import qwen35_from_qwen3

    rng = random.Random(args.seed)
    corpus = json.load(open(os.path.join(args.fixtures, "tokenizer", "corpus.json"), encoding="utf-8"))
    sample = rng.sample(corpus, min(args.n, len(corpus)))
    for _ in range(args.n // 4):  # random slices (by code point) and concatenations
        s = rng.choice(corpus)
        a = rng.randint(0, len(s))
        sample.append(s[a:a + rng.randint(1, 100)])
        sample.append(rng.choice(["", " ", "\n"]).join(rng.choice(corpus) for _ in range(rng.randint(2, 4))))

    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.json")
        json.dump(sample, open(inp, "w", encoding="utf-8"), ensure_ascii=False)
        tok_dirs = {n: os.path.join(args.fixtures, "tokenizers", n)
                    for n in ["qwen3", "llama3", "deepseek_v3", "fathom_default"]}
        q35 = os.path.join(tmp, "qwen35")
        os.makedirs(q35)
        q3 = json.load(open(os.path.join(tok_dirs["qwen3"], "tokenizer.json"), encoding="utf-8"))
        json.dump(qwen35_from_qwen3(q3), open(os.path.join(q35, "tokenizer.json"), "w", encoding="utf-8"),
                  ensure_ascii=False)
        tok_dirs["qwen35"] = q35
        for name, d in tok_dirs.items():
            hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            for special in (False, True):
                cmd = [args.fathom, "tokenize", d, "--input-json", inp] + ([] if special else ["--no-special"])
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAIL {name}: fathom exited {r.returncode}: {r.stderr.strip()}")
                    failed += len(sample)
                    continue
                got = json.loads(r.stdout)
                want = [e.ids for e in hf.encode_batch(sample, add_special_tokens=special)]
                for s, g, w in zip(sample, got, want):
                    if g == w:
                        passed += 1
                    else:
                        failed += 1
                        if failed <= 10:
                            print(f"MISMATCH {name} special={special} {s[:120]!r}\n  hf:     {w[:30]}\n  fathom: {g[:30]}")
    print(f"seed {args.seed}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
