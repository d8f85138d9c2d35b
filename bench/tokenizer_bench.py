#!/usr/bin/env python3
"""Single-thread encode throughput (MB/s) of Fathom vs HF `tokenizers` on the same text.

Texts: (1) the tokenizer test corpus concatenated and repeated to --mb MB, (2) plain English
(the GPL/Apache/Artistic license texts of /usr/share/common-licenses) repeated to --mb MB.
Two modes: "docs" encodes the text as ~2 KB documents one after the other; "whole" encodes the
first --whole-mb MB as one string. add_special_tokens=False; median of --repeats runs after one
warm-up run (which fills both tokenizers' word caches). Token counts are checked to be equal.
Usage: python3 bench/tokenizer_bench.py --fathom build/fathom [--fixtures tests/fixtures] [--mb 4] [--repeats 5]
"""
import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def make_texts(root, mb):
    corpus = json.load(open(os.path.join(root, "tests", "fixtures", "tokenizer", "corpus.json"), encoding="utf-8"))
    c = "\n".join(corpus)
    english = ""
    for f in ["GPL-3", "Apache-2.0", "Artistic", "LGPL-3", "MPL-2.0"]:
        p = os.path.join("/usr/share/common-licenses", f)
        if os.path.exists(p):
            english += open(p, encoding="utf-8").read() + "\n"
    target = int(mb * 1024 * 1024)
    rep = lambda s: (s * (target // len(s.encode()) + 1))
    out = {"corpus": rep(c), "english": rep(english)}
    # Trim to about the target size on a character boundary.
    for k, v in out.items():
        while len(v.encode()) > target * 1.05:
            v = v[: int(len(v) * 0.95)]
        out[k] = v
    return out


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", default=os.path.join(root, "build", "fathom"))
    ap.add_argument("--fixtures", default=os.path.join(root, "tests", "fixtures"))
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--whole-mb", type=float, default=1)
    ap.add_argument("--tokenizers", default="qwen3,llama3,deepseek_v3")
    args = ap.parse_args()
    from tokenizers import Tokenizer, __version__ as hf_version

    texts = make_texts(root, args.mb)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tname, text in texts.items():
            # "docs": the text cut into ~2 KB documents at line ends, encoded one by one (the usual
            # server case); "whole": the first --whole-mb MB as one string.
            docs, cur = [], []
            size = 0
            for line in text.splitlines(keepends=True):
                cur.append(line)
                size += len(line)
                if size >= 2048:
                    docs.append("".join(cur))
                    cur, size = [], 0
            if cur:
                docs.append("".join(cur))
            whole = text[: int(args.whole_mb * 1024 * 1024)]
            for mode, inputs in (("docs", docs), ("whole", [whole])):
                path = os.path.join(tmp, f"{tname}_{mode}.json")
                json.dump(inputs, open(path, "w", encoding="utf-8"), ensure_ascii=False)
                nbytes = sum(len(s.encode()) for s in inputs)
                for name in args.tokenizers.split(","):
                    d = os.path.join(args.fixtures, "tokenizers", name)
                    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
                    for s in inputs:  # warm-up
                        hf.encode(s, add_special_tokens=False)
                    hf_times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        n_hf = 0
                        for s in inputs:
                            n_hf += len(hf.encode(s, add_special_tokens=False).ids)
                        hf_times.append(time.perf_counter() - t0)
                    r = subprocess.run([args.fathom, "tokenize", d, "--input-json", path, "--no-special",
                                        "--bench", str(args.repeats + 1)], capture_output=True, text=True, check=True)
                    rep = json.loads(r.stdout)
                    f_times = rep["seconds"][1:]
                    assert rep["tokens"] == n_hf, (name, tname, rep["tokens"], n_hf)
                    hf_mbs = nbytes / 1e6 / statistics.median(hf_times)
                    f_mbs = nbytes / 1e6 / statistics.median(f_times)
                    rows.append((tname, mode, name, nbytes, n_hf, hf_mbs, f_mbs))
                    print(f"{tname:8s} {mode:5s} {name:12s} {nbytes/1e6:6.2f} MB {n_hf:9d} tok  HF {hf_mbs:7.2f} MB/s  "
                          f"Fathom {f_mbs:7.2f} MB/s  x{f_mbs/hf_mbs:5.2f}", flush=True)
    cpu = platform.processor()
    try:
        cpu = [l.split(":", 1)[1].strip() for l in subprocess.check_output(["lscpu"], text=True).splitlines()
               if l.startswith("Model name")][0]
    except Exception:
        pass
    print(json.dumps({"cpu": cpu, "tokenizers": hf_version, "rows": rows}))


if __name__ == "__main__":
    sys.exit(main())
