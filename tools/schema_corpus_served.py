"""The real-world JSON Schema corpus (tools/make_schema_corpus.py) through a running `fathom serve`:
each K-th schema of each source sent as `response_format: json_schema` to /v1/chat/completions
with the real model sampling (temperature 0.7, a seed per request), and every finished output
validated with Python `jsonschema` (the draft the schema names, our enforced formats asserted as
tests/grammar/schema_corpus.py does). Complements that check, whose "model" is a uniform random
choice among the tokens the grammar allows.

  python3 tools/schema_corpus_served.py --url http://127.0.0.1:8000 --corpus DIR [--every 50] [--max-tokens 1024]

Exit 1 on any finished output that is invalid.
"""
import argparse
import collections
import json
import os
import sys

import jsonschema
import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "grammar"))
from schema_corpus import format_checker  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=1024)
    args = ap.parse_args()
    manifest = json.load(open(os.path.join(args.corpus, "manifest.json")))
    by_source = collections.defaultdict(list)
    for name, rel in manifest.items():
        by_source[name.split("/")[0]].append((name, rel))
    stats = collections.defaultdict(collections.Counter)
    refusals, bad = collections.Counter(), []
    for source, items in sorted(by_source.items()):
        for i, (name, rel) in enumerate(sorted(items)):
            if i % args.every:
                continue
            schema = json.load(open(os.path.join(args.corpus, rel)))
            st = stats[source]
            st["sent"] += 1
            body = {"messages": [{"role": "user", "content": "Reply with one JSON value for the given schema."}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
                    "temperature": 0.7, "seed": i + 1, "max_tokens": args.max_tokens}
            r = requests.post(args.url + "/v1/chat/completions", json=body, timeout=600)
            if r.status_code == 400:
                refusals[r.json()["error"].get("param") or r.json()["error"]["message"][:60]] += 1
                continue
            r.raise_for_status()
            st["accepted"] += 1
            choice = r.json()["choices"][0]
            if choice["finish_reason"] != "stop":
                st["cut"] += 1  # ran into max_tokens: not a finished output
                continue
            st["finished"] += 1
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            try:
                cls(schema, format_checker=format_checker(cls)).validate(json.loads(choice["message"]["content"]))
                st["valid"] += 1
            except Exception as e:  # noqa: BLE001 - every kind of failure counts
                bad.append(f"{name}: {e.__class__.__name__}: {str(e)[:200]} in {choice['message']['content'][:200]!r}")
    print(f"{'source':12s} {'sent':>6s} {'accepted':>9s} {'finished':>9s} {'cut':>5s} {'valid':>6s}")
    for source, s in sorted(stats.items()):
        print(f"{source:12s} {s['sent']:6d} {s['accepted']:9d} {s['finished']:9d} {s['cut']:5d} {s['valid']:6d}")
    finished = sum(s["finished"] for s in stats.values())
    valid = sum(s["valid"] for s in stats.values())
    print(f"finished outputs valid: {valid}/{finished}; refusals: {dict(refusals)}")
    for b in bad[:20]:
        print("  INVALID", b)
    return 0 if not bad and finished > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
