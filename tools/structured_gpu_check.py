#!/usr/bin/env python3
"""Structured output through a running `fathom serve` on the GPU, checked with `jsonschema` on a
machine that has it (the GPU machine does not):

  sample:   on the GPU machine, for each schema of tests/server/structured_schemas.py, N sampled
            completions (temperature 1, seeds 0..N-1) at concurrency 32 (the overlapped engine
            with masks that come after the step in flight), plus N requests mixing all schemas;
            writes every output as JSON lines.
  validate: here, every output that finished ("stop") must validate against its schema; outputs
            cut by max_tokens are counted apart.

usage: tools/structured_gpu_check.py sample --url http://127.0.0.1:8000 --out FILE [--samples 200]
       tools/structured_gpu_check.py validate FILE
"""
import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
from structured_schemas import SCHEMAS  # noqa: E402


def sample(url, out, n):
    import requests
    model = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]

    def one(job):
        k, seed = job
        body = {"model": model, "prompt": "Answer:", "structured_outputs": {"json": SCHEMAS[k]}, "temperature": 1.0,
                "seed": seed, "max_tokens": 400}
        r = requests.post(url + "/v1/completions", json=body, timeout=600)
        c = r.json()["choices"][0] if r.status_code == 200 else {"finish_reason": f"http {r.status_code}", "text": r.text}
        return {"schema": k, "seed": seed, "finish_reason": c["finish_reason"], "text": c["text"]}
    jobs = [(k, seed) for k in range(len(SCHEMAS)) for seed in range(n)]
    jobs += [(i % len(SCHEMAS), 1000 + i) for i in range(n)]  # every schema in the same batches
    with ThreadPoolExecutor(32) as pool, open(out, "w") as f:
        for rec in pool.map(one, jobs):
            f.write(json.dumps(rec) + "\n")
    print(f"{len(jobs)} outputs written to {out}")


def validate(path):
    """Outputs that finished ("stop") must validate. Outputs cut by max_tokens (a model may write an
    integer that never ends: the grammar allows it) are counted apart and not passed: they are only
    reported, with their schema."""
    import jsonschema
    bad = finished = 0
    cut = {}
    for line in open(path):
        rec = json.loads(line)
        if rec["finish_reason"] == "length":
            cut[rec["schema"]] = cut.get(rec["schema"], 0) + 1
            continue
        finished += 1
        try:
            assert rec["finish_reason"] == "stop", rec["finish_reason"]
            jsonschema.validate(json.loads(rec["text"]), SCHEMAS[rec["schema"]])
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            bad += 1
            if bad <= 10:
                print(f"schema {rec['schema']} seed {rec['seed']}: {e}\n  {rec['text']!r}")
    print(f"{finished - bad} of {finished} finished outputs valid; cut by max_tokens (not checked), by schema: {cut}")
    return 0 if bad == 0 and finished > 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--url", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--samples", type=int, default=200)
    v = sub.add_parser("validate")
    v.add_argument("file")
    a = ap.parse_args()
    if a.cmd == "sample":
        sample(a.url, a.out, a.samples)
        return 0
    return validate(a.file)


if __name__ == "__main__":
    sys.exit(main())
