"""The JSON Schema compiler used as a recognizer on the official JSON-Schema-Test-Suite (draft
2020-12, the files of every keyword we enforce). The suite comes from the `jsonschema` sdist on
PyPI, which vendors it under json/tests (downloaded with pip unless --suite DIR is given).

Each test instance is serialized as the grammar writes JSON (json.dumps, ", " and ": ") and fed to
the grammar; Python jsonschema's verdict (with the format checkers of the formats we enforce)
decides, which is the suite's except where jsonschema's checkers differ (leap seconds, which
its RFC 3339 checker refuses; its e-mail check, which only looks for an "@"), counted apart:
  - accepted but invalid: a soundness failure (the test fails);
  - rejected but valid: the documented subset (property order, bounded numbers, ...), counted;
  - a schema refused: counted by keyword.
With --fixtures, 8 seeded random outputs of each accepted schema (a uniform "model" over the
allowed tokens at the default model's vocabulary) must validate too (soundness beyond the suite's
instances).

  python3 tests/grammar/test_schema_suite.py --fathom build/fathom [--suite DIR] [--max-incomplete F]
      [--undeclared-keys free-form,any]
(ctest passes --fathom; the schema_check tool is built next to it.) Each mode of undeclared keys
listed is checked in turn: free-form is what the server does by default (objects that declare no
key take any; the others only theirs), any is JSON Schema's own rule.
"""
import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tarfile
import tempfile

import jsonschema

FORMATS = ["date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference", "uuid"]
KEYWORD_FILES = [
    "additionalProperties", "allOf", "anchor", "anyOf", "boolean_schema", "const", "contains", "defs",
    "dependentRequired", "dependentSchemas", "enum", "exclusiveMaximum", "exclusiveMinimum", "if-then-else",
    "items", "maxItems", "maxLength", "maxProperties", "maximum", "minContains", "minItems", "minLength",
    "minProperties", "minimum", "multipleOf", "not", "oneOf", "pattern", "patternProperties", "prefixItems",
    "properties", "propertyNames", "ref", "required", "type", "uniqueItems",
    "optional/format/date", "optional/format/date-time", "optional/format/time", "optional/format/duration",
    "optional/format/email", "optional/format/hostname", "optional/format/ipv4", "optional/format/ipv6",
    "optional/format/uri", "optional/format/uuid",
]


def fetch_suite(tmp):
    """The installed jsonschema's sdist, fetched by its URL from PyPI's simple index (JSON form; pip
    download would prepare the sdist's metadata, building its build backend from source)."""
    import importlib.metadata
    import requests
    version = importlib.metadata.version("jsonschema")
    name = f"jsonschema-{version}.tar.gz"
    index = requests.get("https://pypi.org/simple/jsonschema/", timeout=60,
                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    index.raise_for_status()
    url = next(f["url"] for f in index.json()["files"] if f["filename"] == name)
    sdist = os.path.join(tmp, name)
    with requests.get(url, timeout=120) as r:
        r.raise_for_status()
        with open(sdist, "wb") as f:
            f.write(r.content)
    with tarfile.open(sdist) as t:
        members = [m for m in t.getmembers() if "/json/tests/draft2020-12/" in m.name]
        t.extractall(tmp, members=members)
    return glob.glob(os.path.join(tmp, "jsonschema-*", "json", "tests", "draft2020-12"))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures")
    ap.add_argument("--suite")
    ap.add_argument("--max-incomplete", type=float, default=0.25,
                    help="largest share of valid instances the grammar may reject (the subset)")
    ap.add_argument("--undeclared-keys", default="free-form,any")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    suite = args.suite or fetch_suite(tmp.name)
    exe = os.path.join(os.path.dirname(os.path.abspath(args.fathom)), "schema_check")
    cmd = [exe]
    if args.fixtures:
        cmd += ["--tokenizer", os.path.join(args.fixtures, "tokenizers", "fathom_default", "tokenizer.json")]
    latest = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    checker = jsonschema.FormatChecker(formats=())
    checker.checkers = {f: latest[f] for f in FORMATS}
    ok = True
    for mode in args.undeclared_keys.split(","):
        print(f"== undeclared keys: {mode}")
        ok &= check(args, suite, tmp.name, cmd, checker, mode)
    return 0 if ok else 1


def check(args, suite, tmpdir, cmd, checker, mode):
    sampled = 0
    tool = subprocess.Popen(cmd + ["--undeclared-keys", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    per_file = {}
    unsound, refused = [], collections.Counter()
    schema_path = os.path.join(tmpdir, "schema.json")
    for name in KEYWORD_FILES:
        path = os.path.join(suite, name + ".json")
        if not os.path.exists(path):
            sys.exit(f"missing suite file {path}")
        c = collections.Counter()
        for gi, group in enumerate(json.load(open(path))):
            with open(schema_path, "w") as f:
                json.dump(group["schema"], f)
            if args.fixtures:
                tool.stdin.write(f"sample {schema_path} 8 {gi + 1}\n")
                tool.stdin.flush()
                first = tool.stdout.readline().strip()
                outs = [] if first.startswith("refused") else [first] + [tool.stdout.readline().strip() for _ in range(7)]
                validator = jsonschema.Draft202012Validator(group["schema"], format_checker=checker)
                for line in outs:
                    complete, _, hexed = line.partition(" ")
                    raw = bytes.fromhex(hexed)
                    sampled += 1
                    try:
                        assert complete == "1", "did not finish"
                        validator.validate(json.loads(raw.decode("utf-8")))
                    except Exception as e:  # noqa: BLE001 - every kind of failure counts
                        unsound.append(f"{name}: {group['description']}: sampled {raw[:200]!r}: {str(e)[:200]}")
            validator = jsonschema.Draft202012Validator(group["schema"], format_checker=checker)
            for test in group["tests"]:
                text = json.dumps(test["data"], ensure_ascii=False)
                valid = validator.is_valid(test["data"])
                c["suite_differs"] += valid != test["valid"]
                tool.stdin.write(f"recognize {schema_path} {text.encode().hex() or '00'}\n")
                tool.stdin.flush()
                answer = tool.stdout.readline().strip()
                if answer.startswith("refused"):
                    refused[answer.split(" ")[1]] += 1
                    c["refused"] += 1
                    continue
                accepted = answer == "1" and text != ""
                c["valid" if valid else "invalid"] += 1
                if accepted and not valid:
                    unsound.append(f"{name}: {group['description']} / {test['description']}: {text}")
                elif not accepted and valid:
                    c["incomplete"] += 1
                    if args.verbose:
                        print(f"  rejected valid: {name}: {group['description']} / {test['description']}: {text}")
                else:
                    c["agree"] += 1
        per_file[name] = c
    print(f"{'file':28s} {'agree':>6s} {'valid-rejected':>15s} {'refused':>8s}")
    for name, c in per_file.items():
        print(f"{name:28s} {c['agree']:6d} {c['incomplete']:15d} {c['refused']:8d}")
    total = collections.Counter()
    for c in per_file.values():
        total.update(c)
    cases = total["agree"] + total["incomplete"] + len(unsound)
    print(f"cases {cases + total['refused']}: {total['agree']} agree, {total['incomplete']} valid instances rejected "
          f"(the documented subset), {len(unsound)} invalid instances accepted, {total['refused']} refused "
          f"{dict(refused)}")
    print(f"cases where jsonschema's verdict is not the suite's (jsonschema's is used): {total['suite_differs']}")
    print(f"sampled outputs validated: {sampled}")
    for u in unsound:
        print("  UNSOUND", u)
    share = total["incomplete"] / max(1, total["valid"])
    print(f"valid instances rejected: {100 * share:.1f}% of {total['valid']}")
    ok = not unsound and share <= args.max_incomplete
    print("PASSED" if ok else "FAILED")
    return ok


if __name__ == "__main__":
    sys.exit(main())
