"""Builds the real-world JSON Schema corpus of issue 35 from pip-installed packages (nothing is
committed; the sources are public PyPI packages):

  schemastore/  the SchemaStore schemas vendored by `check-jsonschema` (CI configurations, ...)
  k8s/          Kubernetes resource schemas shipped by `kubernetes-validate` (one API version),
                made self-contained: the shared `_definitions.json` reachable from each schema is
                copied into its `$defs` (hundreds of `$ref`s each for the large resources)
  openai/       `model_json_schema()` of every pydantic model in the `openai` SDK (API objects)
  anthropic/    the same for the `anthropic` SDK

  python3 tools/make_schema_corpus.py --out DIR [--k8s-version v1.37.0] [--limit-per-source N]

Writes DIR/<source>/<name>.json and DIR/manifest.json ({"name": "source/file", ...}).
"""
import argparse
import importlib
import importlib.resources
import inspect
import json
import os
import pkgutil
import re
import sys


def schemastore():
    import check_jsonschema.builtin_schemas.vendor as vendor
    root = importlib.resources.files(vendor)
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            yield entry.name[:-5], json.loads(entry.read_text())


def _k8s_refs(node, out):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and "#/$defs/" in ref:
            out.add(ref.split("#/$defs/", 1)[1])
        for v in node.values():
            _k8s_refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _k8s_refs(v, out)


def _k8s_local(node):
    if isinstance(node, dict):
        return {k: ("#/$defs/" + v.split("#/$defs/", 1)[1] if k == "$ref" and isinstance(v, str)
                    and "#/$defs/" in v else _k8s_local(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_k8s_local(v) for v in node]
    return node


def k8s(version):
    import kubernetes_validate
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema", version + "-local")
    defs = json.load(open(os.path.join(base, "_definitions.json")))["$defs"]
    for name in sorted(os.listdir(base)):
        if not name.endswith(".json") or name in ("_definitions.json", "all.json"):
            continue
        schema = json.load(open(os.path.join(base, name)))
        needed, todo = set(), set()
        _k8s_refs(schema, todo)
        while todo:  # the definitions reachable from the schema
            d = todo.pop()
            if d in needed or d not in defs:
                continue
            needed.add(d)
            _k8s_refs(defs[d], todo)
        schema = _k8s_local(schema)
        if needed:
            schema["$defs"] = {d: _k8s_local(defs[d]) for d in sorted(needed)}
        yield name[:-5], schema


def pydantic_models(package):
    import pydantic
    pkg = importlib.import_module(package + ".types")
    seen = set()
    for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        try:
            m = importlib.import_module(mod.name)
        except Exception:  # noqa: BLE001 - optional extras of the SDK
            continue
        for name, obj in vars(m).items():
            if (inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj.__module__ == m.__name__
                    and obj not in seen):
                seen.add(obj)
                try:
                    schema = obj.model_json_schema()
                except Exception:  # noqa: BLE001 - a model pydantic cannot describe
                    continue
                yield f"{m.__name__[len(package) + 7:]}.{name}", schema


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--k8s-version", default="v1.37.0")
    ap.add_argument("--limit-per-source", type=int, default=0)
    args = ap.parse_args()
    sources = {
        "schemastore": schemastore(),
        "k8s": k8s(args.k8s_version),
        "openai": pydantic_models("openai"),
        "anthropic": pydantic_models("anthropic"),
    }
    manifest = {}
    for source, items in sources.items():
        os.makedirs(os.path.join(args.out, source), exist_ok=True)
        n = 0
        for name, schema in items:
            if args.limit_per_source and n >= args.limit_per_source:
                break
            fname = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".json"
            with open(os.path.join(args.out, source, fname), "w") as f:
                json.dump(schema, f)
            manifest[f"{source}/{fname[:-5]}"] = f"{source}/{fname}"
            n += 1
        print(f"{source}: {n} schemas", file=sys.stderr)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=0)


if __name__ == "__main__":
    main()
