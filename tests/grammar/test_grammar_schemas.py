"""Constrained decoding against 10 JSON schemas: 200 outputs each of a seeded random "model"
(uniform over the tokens the grammar allows, at the Qwen3 vocabulary) must all end, be UTF-8,
parse as JSON and validate against their schema (Python's jsonschema).

Run by ctest as: python3 test_grammar_schemas.py --fathom BIN --fixtures FIXTURES_DIR
(the grammar_sample tool is built next to BIN).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import jsonschema

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": "string", "pattern": "^[a-z0-9._]+@[a-z]+\\.(com|org|net)$"},
            "nickname": {"type": ["string", "null"]},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "product": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "title": {"type": "string", "maxLength": 40},
            "price": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
            "in_stock": {"type": "boolean"},
        },
        "required": ["id", "title", "price", "tags", "in_stock"],
    },
    "status": {
        "type": "object",
        "properties": {
            "status": {"enum": ["queued", "running", "done", "failed"]},
            "version": {"const": 2},
            "code": {"enum": [200, 404, None, True, "x\"y"]},
        },
        "required": ["status", "version"],
    },
    "order": {
        "type": "object",
        "properties": {
            "customer": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}},
                "required": ["name"],
            },
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{4}"},
                                   "qty": {"type": "integer"}},
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 4,
            },
        },
        "required": ["customer", "lines"],
    },
    "any_of": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer"}, {"type": "null"}]},
            "choice": {"oneOf": [{"const": "a"}, {"type": "array", "items": {"type": "number"}, "maxItems": 2}]},
        },
        "required": ["value", "choice"],
    },
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["name"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "string_map": {"type": "object", "additionalProperties": {"type": "number"}},
    "lengths": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "minLength": 3, "maxLength": 8},
            "slug": {"type": "string", "pattern": "^[a-z]+(_[a-z]+)*$"},
            "note": {"type": "string", "pattern": "[^\"\\\\]{0,5}(\\\\|\"|\\n)?"},
        },
        "required": ["code", "slug", "note"],
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                },
                "required": ["location", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
    },
    "top_array": {
        "definitions": {"cell": {"type": ["number", "boolean", "null"]}},
        "type": "array",
        "items": {"$ref": "#/definitions/cell"},
        "minItems": 2,
        "maxItems": 6,
    },
}

COUNT = 200


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    tool = os.path.join(os.path.dirname(os.path.abspath(args.fathom)), "grammar_sample")
    tokenizer = os.path.join(args.fixtures, "tokenizers", "qwen3", "tokenizer.json")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed, (name, schema) in enumerate(SCHEMAS.items(), start=1):
            jsonschema.Draft202012Validator.check_schema(schema)
            validator = jsonschema.Draft202012Validator(schema)
            schema_path = os.path.join(tmp, name + ".json")
            out_path = os.path.join(tmp, name + ".out")
            with open(schema_path, "w") as f:
                json.dump(schema, f)
            subprocess.run([tool, "--tokenizer", tokenizer, "--schema", schema_path, "--count", str(COUNT),
                            "--seed", str(seed), "--out", out_path, "--padded", "151936"], check=True, timeout=600)
            lines = open(out_path).read().splitlines()
            assert len(lines) == COUNT, f"{name}: {len(lines)} outputs"
            bad, distinct = [], set()
            for line in lines:
                complete, _, hexed = line.partition(" ")
                raw = bytes.fromhex(hexed)
                try:
                    assert complete == "1", "did not end"
                    text = raw.decode("utf-8")
                    validator.validate(json.loads(text))
                    distinct.add(text)
                except Exception as e:  # noqa: BLE001 - report every kind of failure
                    bad.append(f"{e.__class__.__name__}: {str(e)[:200]} in {raw[:300]!r}")
            status = "ok" if not bad else f"{len(bad)} FAILED"
            print(f"{name:12s} {COUNT} outputs, {len(distinct)} distinct: {status}")
            for b in bad[:5]:
                print("   ", b)
            failures += len(bad)
            if len(distinct) < COUNT // 4:
                print(f"   too few distinct outputs ({len(distinct)})")
                failures += 1
    print("FAILED" if failures else "PASSED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
