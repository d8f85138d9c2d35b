"""Soundness of the object keywords that interact (properties, required, dependentRequired,
dependentSchemas, minProperties/maxProperties, additionalProperties, patternProperties) on
randomly built schemas: every finished output sampled from an accepted schema's grammar (a
uniform "model" over the allowed tokens, seeded) must validate under Python jsonschema, in both
modes of undeclared keys. The schemas come from a fixed seed (the same every run); a refusal is
fine, an invalid output fails the test. (Stop 48 found dependency chains and contradictory
property counts this way, which the JSON-Schema-Test-Suite cases did not reach.)

  python3 tests/grammar/test_schema_fuzz.py --fathom build/fathom --fixtures tests/fixtures [--schemas N]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import jsonschema

NAMES = ["a", "b", "c", "d", "e"]
VALUES = [{}, {"type": "integer"}, {"type": "string"}, {"minimum": 3}, {"type": "integer", "maximum": 1},
          {"enum": [1, "x"]}, {"type": "array", "maxItems": 1}, False]


def random_schema(rng):
    def props(lo, hi):
        return {n: rng.choice(VALUES) for n in rng.sample(NAMES, rng.randint(lo, hi))}
    s = {"type": "object"}
    if rng.random() < 0.8:
        s["properties"] = props(0, 4)
    if rng.random() < 0.6:
        s["dependentRequired"] = {n: rng.sample(NAMES, rng.randint(0, 2)) for n in rng.sample(NAMES, rng.randint(1, 4))}
    if rng.random() < 0.5:
        deps = {}
        for n in rng.sample(NAMES, rng.randint(1, 4)):
            d = {}
            if rng.random() < 0.6:
                d["required"] = rng.sample(NAMES, rng.randint(1, 2))
            if rng.random() < 0.6:
                d["properties"] = props(1, 2)
            if rng.random() < 0.2:
                d["maxProperties"] = rng.randint(1, 3)
            deps[n] = d
        s["dependentSchemas"] = deps
    if rng.random() < 0.3:
        s["maxProperties"] = rng.randint(1, 4)
    if rng.random() < 0.2:
        s["minProperties"] = rng.randint(0, 2)
    if rng.random() < 0.3:
        s["required"] = rng.sample(NAMES, rng.randint(1, 2))
    if rng.random() < 0.2:
        s["additionalProperties"] = rng.choice([False, {"type": "integer"}])
    if rng.random() < 0.15:
        s["patternProperties"] = {"^x": {"type": "boolean"}}
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--schemas", type=int, default=1500)
    args = ap.parse_args()
    tool = os.path.join(os.path.dirname(os.path.abspath(args.fathom)), "schema_check")
    tokenizer = os.path.join(args.fixtures, "tokenizers", "fathom_default", "tokenizer.json")
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schema.json")
        for mode in ["free-form", "any"]:
            p = subprocess.Popen([tool, "--tokenizer", tokenizer, "--undeclared-keys", mode], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, bufsize=1)
            rng = random.Random(48)
            accepted = outputs = 0
            for i in range(args.schemas):
                schema = random_schema(rng)
                with open(path, "w") as f:
                    json.dump(schema, f)
                p.stdin.write(f"sample {path} 8 {i + 1}\n")
                p.stdin.flush()
                first = p.stdout.readline().strip()
                if first.startswith("refused"):
                    continue
                accepted += 1
                validator = jsonschema.Draft202012Validator(schema)
                for line in [first] + [p.stdout.readline().strip() for _ in range(7)]:
                    complete, _, hexed = line.partition(" ")
                    outputs += 1
                    raw = bytes.fromhex(hexed)
                    try:
                        assert complete == "1", "did not finish"
                        validator.validate(json.loads(raw.decode("utf-8")))
                    except Exception as e:  # noqa: BLE001 - every kind of failure counts
                        bad.append(f"{mode}: {json.dumps(schema)}: {raw[:120]!r}: {str(e).splitlines()[0][:120]}")
            p.stdin.close()
            p.wait()
            print(f"{mode}: {args.schemas} schemas, {accepted} accepted, {outputs} outputs")
            if accepted < args.schemas // 2:
                bad.append(f"{mode}: only {accepted} of {args.schemas} schemas accepted")
    for b in bad[:20]:
        print("INVALID", b)
    print(f"{len(bad)} invalid" if bad else "PASSED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
