"""The real-world JSON Schema corpus check of issue 35: every schema compiled (accepted or refused,
refusals tabulated by keyword), and for the accepted ones seeded random constrained outputs (a
uniform "model" over the tokens the grammar allows, at the given tokenizer's vocabulary) validated
with Python `jsonschema` (the draft the schema names; formats we enforce are asserted).

  python3 tests/grammar/schema_corpus.py --tool build/schema_check --tokenizer TOKENIZER.json \
      [--corpus DIR | (built with tools/make_schema_corpus.py)] [--every K] [--samples N] [--min-accept 0.95]

--every K keeps every K-th schema of each source (the CI subset). Exit 1 on any invalid or
unfinished output or an acceptance rate below --min-accept.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

import jsonschema

ENFORCED_FORMATS = ["date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
                    "uri-reference", "uuid"]


def format_checker(cls):
    """The formats we enforce, each by the schema draft's own checker (draft 3's "time" differs),
    or 2020-12's where the draft has none (draft 7 has no uuid)."""
    latest = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    missing = [f for f in ENFORCED_FORMATS if f not in latest]
    if missing:  # a silently skipped format check would count as a pass
        sys.exit(f"jsonschema lacks format checkers {missing}: install jsonschema[format]")
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {f: cls.FORMAT_CHECKER.checkers.get(f, latest[f]) for f in ENFORCED_FORMATS}
    return checker


class Tool:
    def __init__(self, path, tokenizer):
        self.p = subprocess.Popen([path, "--tokenizer", tokenizer], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)

    def ask(self, line, n=1):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        first = self.p.stdout.readline().rstrip("\n")
        if first.startswith("refused") or n == 1:
            return [first]
        return [first] + [self.p.stdout.readline().rstrip("\n") for _ in range(n - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--min-accept", type=float, default=0.95)
    ap.add_argument("--report", help="write the per-schema results (JSON) here")
    args = ap.parse_args()
    tmp = None
    corpus = args.corpus
    if not corpus:
        tmp = tempfile.TemporaryDirectory()
        corpus = tmp.name
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..", "..", "tools",
                                                      "make_schema_corpus.py"), "--out", corpus], check=True)
    manifest = json.load(open(os.path.join(corpus, "manifest.json")))
    by_source = collections.defaultdict(list)
    for name, rel in manifest.items():
        by_source[name.split("/")[0]].append((name, rel))
    format_checker(jsonschema.Draft202012Validator)  # fails early without the format packages
    tool = Tool(args.tool, args.tokenizer)
    stats = collections.defaultdict(collections.Counter)
    refusals, compile_ms, bad, results = collections.Counter(), [], [], {}
    for source, items in sorted(by_source.items()):
        for i, (name, rel) in enumerate(sorted(items)):
            if i % args.every:
                continue
            path = os.path.join(corpus, rel)
            schema = json.load(open(path))
            st = stats[source]
            st["schemas"] += 1
            answer = tool.ask(f"compile {path}")[0]
            if answer.startswith("refused"):
                kw = answer.split(" ", 2)[1]
                refusals[kw] += 1
                results[name] = answer
                continue
            st["accepted"] += 1
            compile_ms.append(float(answer.split()[1]))
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            validator = cls(schema, format_checker=format_checker(cls))
            outs = tool.ask(f"sample {path} {args.samples} {i + 1}", args.samples)
            for line in outs:
                complete, _, hexed = line.partition(" ")
                raw = bytes.fromhex(hexed)
                st["outputs"] += 1
                try:
                    if complete != "1":
                        raise AssertionError("did not finish")
                    validator.validate(json.loads(raw.decode("utf-8")))
                    st["valid"] += 1
                except Exception as e:  # noqa: BLE001 - every kind of failure counts
                    bad.append(f"{name}: {e.__class__.__name__}: {str(e)[:300]} in {raw[:300]!r}")
            results[name] = "ok"
    total = sum(s["schemas"] for s in stats.values())
    accepted = sum(s["accepted"] for s in stats.values())
    outputs = sum(s["outputs"] for s in stats.values())
    valid = sum(s["valid"] for s in stats.values())
    print(f"{'source':12s} {'schemas':>8s} {'accepted':>9s} {'outputs':>8s} {'valid':>8s}")
    for source, s in sorted(stats.items()):
        print(f"{source:12s} {s['schemas']:8d} {s['accepted']:9d} {s['outputs']:8d} {s['valid']:8d}")
    print(f"total: {accepted}/{total} accepted ({100.0 * accepted / max(total, 1):.1f}%), "
          f"{valid}/{outputs} outputs finished and valid")
    if compile_ms:
        compile_ms.sort()
        print(f"grammar build (no vocabulary): median {statistics.median(compile_ms):.2f} ms, "
              f"p90 {compile_ms[int(0.9 * len(compile_ms))]:.2f} ms, max {compile_ms[-1]:.1f} ms")
    print("refusals by keyword:", dict(refusals.most_common()))
    for b in bad[:20]:
        print("  INVALID", b)
    if args.report:
        json.dump(results, open(args.report, "w"), indent=0)
    ok = not bad and total > 0 and accepted >= args.min_accept * total
    print("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
