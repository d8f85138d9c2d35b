"""Soundness of the keywords that interact, on randomly built schemas: objects (properties,
required, dependentRequired, dependentSchemas, minProperties/maxProperties,
additionalProperties, patternProperties) and, every other schema, numbers, strings and arrays
under bounds, formats, patterns, contains, uniqueItems and the combinators over them: every finished output sampled from an accepted schema's grammar (a
uniform "model" over the allowed tokens, seeded) must validate under Python jsonschema, in both
modes of undeclared keys. The schemas come from a fixed seed (the same every run); a refusal is
fine, an invalid output fails the test. (Stop 48 found dependency chains and contradictory
property counts this way, which the JSON-Schema-Test-Suite cases did not reach.)

  python3 tests/grammar/test_schema_fuzz.py --fathom build/fathom --fixtures tests/fixtures [--schemas N] [--seed S]
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
          {"enum": [1, "x"]}, {"type": "array", "maxItems": 1}, False,
          # no instance, found only when compiled: left out where optional, else the object has none
          {"allOf": [{"const": 1}, {"const": 2}]}, {"type": "object", "properties": {"z": {"enum": [1], "const": 2}},
                                                    "required": ["z"]}]


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
        s["patternProperties"] = rng.choice([{"^x": {"type": "boolean"}}, {"a": {"type": "integer"}, "^b": {"maximum": 5}},
                                             {"^[cd]$": False},
                                             # overlapping each other and the names
                                             {"a": {"type": "integer"}, "^a": {"maximum": 5}, "e$": {"minimum": 2}},
                                             {"o": {"type": ["string", "integer"]}, "^[a-c]": False},
                                             {"^.$": {"type": "array", "maxItems": 1}, "[0-9]": {"minItems": 1}}])
    return s


def random_value_schema(rng, depth=0):
    """Numbers, strings, arrays and the combinators over them (and objects, shallowly)."""
    kind = rng.choice(["number", "string", "array", "combinator", "object"] if depth < 2 else ["number", "string"])
    if kind == "number":
        s = {"type": rng.choice(["integer", "number"])}
        for k in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]:
            if rng.random() < 0.3:
                s[k] = rng.choice([-3, 0, 1, 2, 2.5, 10, 0.125])
        if rng.random() < 0.2:
            s["multipleOf"] = rng.choice([2, 3, 5])
        if rng.random() < 0.15:
            s["not"] = rng.choice([{"const": 0}, {"minimum": 5}, {"enum": [1, 2]}])
        return s
    if kind == "string":
        s = {"type": "string"}
        if rng.random() < 0.3:
            s["minLength"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["maxLength"] = rng.randint(1, 6)
        if rng.random() < 0.3:
            s["pattern"] = rng.choice(["^a", "b$", "^[0-9]+$", "x|y", "^(ab)*$"])
        if rng.random() < 0.3:
            s["format"] = rng.choice(["date", "email", "uuid", "ipv4", "hostname", "time"])
        if rng.random() < 0.15:
            s["enum"] = rng.sample(["a", "bb", "0", "ab", "2024-01-02"], 2)
        return s
    if kind == "array":
        s = {"type": "array"}
        if rng.random() < 0.6:
            s["items"] = random_value_schema(rng, depth + 1)
        if rng.random() < 0.3:
            s["prefixItems"] = [random_value_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.3:
            s["minItems"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["maxItems"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["contains"] = random_value_schema(rng, depth + 1)
            if rng.random() < 0.5:
                s["minContains"] = rng.randint(0, 2)
        if rng.random() < 0.25:
            s["uniqueItems"] = True
        return s
    if kind == "object":
        return random_schema(rng)
    # ($refs point into the root's $defs: only a root schema gets them.)
    key = rng.choice(["anyOf", "oneOf", "allOf", "if", "not", "names", "const"] + (["ref"] if depth == 0 else []))
    if key == "not":
        return {**random_value_schema(rng, depth + 1), "not": rng.choice(
            [{"required": [rng.choice(NAMES)]}, {"type": rng.choice(["string", "integer", "object"])},
             {"type": "object", "required": rng.sample(NAMES, 2)},
             {"const": rng.choice([0, "a", None])}, {"minimum": 2}, {"maxLength": 2}])}
    if key == "ref":  # a definition used twice, and a recursive one
        return {"$defs": {"v": random_value_schema(rng, depth + 1),
                          "tree": {"type": "object", "properties": {"v": {"$ref": "#/$defs/v"},
                                                                    "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"},
                                                                             "maxItems": 2}}}},
                "type": "array", "items": rng.choice([{"$ref": "#/$defs/v"}, {"$ref": "#/$defs/tree"}])}
    if key == "names":
        return {"type": "object", "propertyNames": rng.choice([{"maxLength": 2}, {"pattern": "^x"}, {"enum": ["a", "b"]}]),
                **({"minProperties": 1} if rng.random() < 0.5 else {}),
                **({"additionalProperties": random_value_schema(rng, depth + 1)} if rng.random() < 0.5 else {})}
    if key == "oneOf" and rng.random() < 0.3:  # closed objects with keys of their own ({} matches all)
        names = rng.sample(NAMES, 3)
        return {"oneOf": [{"type": "object", "additionalProperties": False,
                           "properties": {n: rng.choice(VALUES) for n in ([names[0], names[2]] if i else [names[1]])}}
                          for i in range(2)]}
    if key == "const":
        return rng.choice([{"const": {"a": [1, 2], "b": None}}, {"enum": [{"x": 1}, [1, "y"], 2.5, "s"]},
                           {"type": "array", "items": {"enum": ["p", "q", "r"]}, "uniqueItems": True,
                            "minItems": rng.randint(0, 3)}])
    branches = [random_value_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]
    if rng.random() < 0.2:  # a branch with no instance, found only when compiled
        branches[rng.randrange(len(branches))] = {"type": "object", "properties": {"y": {"allOf": [{"const": 1}, {"const": 2}]}},
                                                  "required": ["y"]}
    if key == "if":
        return {"if": branches[0], "then": branches[1], **({"else": branches[2]} if len(branches) > 2 else {})}
    return {key: branches}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--schemas", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=48)
    args = ap.parse_args()
    tool = os.path.join(os.path.dirname(os.path.abspath(args.fathom)), "schema_check")
    tokenizer = os.path.join(args.fixtures, "tokenizers", "fathom_default", "tokenizer.json")
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "schema.json")
        for mode in ["free-form", "any"]:
            p = subprocess.Popen([tool, "--tokenizer", tokenizer, "--undeclared-keys", mode], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, bufsize=1)
            rng = random.Random(args.seed)
            accepted = outputs = 0
            for i in range(args.schemas):
                schema = random_schema(rng) if i % 2 == 0 else random_value_schema(rng)
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
            if accepted < args.schemas // 3:
                bad.append(f"{mode}: only {accepted} of {args.schemas} schemas accepted")
    for b in bad[:20]:
        print("INVALID", b)
    print(f"{len(bad)} invalid" if bad else "PASSED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
