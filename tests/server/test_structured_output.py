"""Structured output through `fathom serve` on the random fixture model (whatever it "wants",
masks decide): for each of 10 JSON schemas, 200 sampled outputs (temperature 1, seeds 0..199) are
valid JSON that Python's `jsonschema` validates against the schema; the other forms (json_object,
regex, choice, GBNF grammar) hold; the official `openai` client's `chat.completions.parse` with
a pydantic model parses what comes back; concurrent requests each keep their own grammar;
tool_choice "required" and a named function give calls whose arguments validate (streamed as
non-streamed); objects without additionalProperties take undeclared keys as the mode says (free-form
by default, vLLM's disable_additional_properties, --structured-output-undeclared-keys any); a
server drafting with n-grams keeps every output valid, as do servers choosing tokens in the runner
(`--sampler device`: overlapped steps whose masks come after the step before is read; with MTP,
sampled fused rounds under the grammar); unsupported schema
keywords, conflicting constraints and hostile nesting get a 400 naming them.

Run by ctest as: python3 test_structured_output.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import requests

from server_util import Server, check, summary
from structured_schemas import SCHEMAS

SAMPLES = 200


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    model = os.path.join(args.fixtures, "qwen35_moe")
    srv = Server(args.fathom, model, "--max-num-seqs", "64")
    url = srv.url + "/v1/completions"
    try:
        cl = srv.client()
        name = cl.models.list().data[0].id

        def complete(body):
            r = requests.post(url, json={"model": name, "prompt": "Answer:", **body}, timeout=120)
            return r.status_code, r.json()

        for k, schema in enumerate(SCHEMAS):
            @check(f"schema {k}: {SAMPLES} sampled outputs validate")
            def _():
                def one(seed):
                    status, r = complete({"structured_outputs": {"json": schema}, "temperature": 1.0, "seed": seed,
                                          "max_tokens": 400})
                    assert status == 200, r
                    c = r["choices"][0]
                    assert c["finish_reason"] == "stop", (seed, c)
                    jsonschema.validate(json.loads(c["text"]), schema)
                    return c["text"]
                with ThreadPoolExecutor(32) as pool:
                    outs = list(pool.map(one, range(SAMPLES)))
                print(f"  e.g. {outs[0]!r}, {outs[1]!r}; {len(set(outs))} distinct")
            _()

        @check("response_format json_schema and json_object on chat")
        def _():
            schema = SCHEMAS[0]
            r = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "Who?"}], max_tokens=300,
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "p", "schema": schema, "strict": True}})
            assert r.choices[0].finish_reason == "stop", r
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
            # Any object: a random model may write a key that never ends; those that end parse.
            ended = 0
            for seed in range(10):
                r = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "Who?"}], max_tokens=200,
                                               seed=seed, temperature=1.0, response_format={"type": "json_object"})
                if r.choices[0].finish_reason == "stop":
                    ended += 1
                    assert isinstance(json.loads(r.choices[0].message.content), dict), r
                else:
                    assert r.choices[0].message.content.startswith("{"), r
            assert ended > 0
        _()

        @check("openai client chat.completions.parse with a pydantic model")
        def _():
            from pydantic import BaseModel, Field

            class Person(BaseModel):
                name: str = Field(max_length=10)
                age: int
            r = cl.chat.completions.parse(model=name, messages=[{"role": "user", "content": "Who?"}],
                                          response_format=Person, max_tokens=300)
            p = r.choices[0].message.parsed
            assert isinstance(p, Person), r
        _()

        @check("regex, choice and GBNF grammar (vLLM's fields)")
        def _():
            for seed in range(20):
                s, r = complete({"guided_regex": "[A-C][0-9]{2}", "seed": seed, "temperature": 1.0, "max_tokens": 20})
                assert s == 200 and re.fullmatch("[A-C][0-9]{2}", r["choices"][0]["text"]), r
                s, r = complete({"guided_choice": ["yes", "no", "maybe"], "seed": seed, "temperature": 1.0})
                assert s == 200 and r["choices"][0]["text"] in ("yes", "no", "maybe"), r
                s, r = complete({"structured_outputs": {"grammar": 'root ::= "(" [ab]+ ")"'}, "seed": seed,
                                 "temperature": 1.0, "max_tokens": 40})
                assert s == 200 and re.fullmatch(r"\([ab]+\)", r["choices"][0]["text"]), r
        _()

        @check("batching: concurrent requests each under its own schema")
        def _():
            def one(i):
                schema = SCHEMAS[i % len(SCHEMAS)]
                status, r = complete({"guided_json": schema, "temperature": 1.0, "seed": 1000 + i, "max_tokens": 400})
                assert status == 200 and r["choices"][0]["finish_reason"] == "stop", r
                jsonschema.validate(json.loads(r["choices"][0]["text"]), schema)
            with ThreadPoolExecutor(40) as pool:
                list(pool.map(one, range(200)))
        _()

        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                     "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                      "days": {"type": "integer"}}, "required": ["city"]}}},
                 {"type": "function", "function": {"name": "add", "parameters": {
                     "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                     "required": ["a", "b"]}}}]
        params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        msgs = [{"role": "user", "content": "Weather?"}]

        @check("tool_choice required (one call): every response is a call whose arguments validate")
        def _():
            for seed in range(30):
                # One call a response (parallel_tool_calls false): a random model would list calls forever.
                r = cl.chat.completions.create(model=name, messages=msgs, tools=tools, tool_choice="required",
                                               parallel_tool_calls=False, seed=seed, temperature=1.0, max_tokens=400)
                c = r.choices[0]
                assert c.finish_reason == "tool_calls" and c.message.tool_calls, c
                for t in c.message.tool_calls:
                    assert t.id.startswith("call_") and t.type == "function"
                    jsonschema.validate(json.loads(t.function.arguments), params[t.function.name])
        _()

        @check("tool_choice naming a function: its call, arguments valid, streamed as non-streamed")
        def _():
            choice = {"type": "function", "function": {"name": "add"}}
            for seed in range(10):
                r = cl.chat.completions.create(model=name, messages=msgs, tools=tools, tool_choice=choice,
                                               seed=seed, temperature=1.0, max_tokens=300)
                t = r.choices[0].message.tool_calls
                assert len(t) == 1 and t[0].function.name == "add", r
                jsonschema.validate(json.loads(t[0].function.arguments), params["add"])
                args, names = "", []
                for ch in cl.chat.completions.create(model=name, messages=msgs, tools=tools, tool_choice=choice,
                                                     seed=seed, temperature=1.0, max_tokens=300, stream=True):
                    for c in ch.choices:
                        assert not c.delta.content, c
                        for d in c.delta.tool_calls or []:
                            if d.function.name:
                                names.append(d.function.name)
                            args += d.function.arguments or ""
                assert names == ["add"] and args == t[0].function.arguments, (names, args, t[0].function.arguments)
            r = requests.post(srv.url + "/v1/chat/completions", timeout=60, json={
                "model": name, "messages": msgs, "tools": tools,
                "tool_choice": {"type": "function", "function": {"name": "x"}}})
            assert r.status_code == 400 and "'x'" in r.json()["error"]["message"], r.text
        _()

        @check("unsupported keywords and conflicting constraints are 400s naming them")
        def _():
            s, r = complete({"guided_json": {"type": "array", "contains": {}, "maxContains": 1}})
            assert s == 400 and "maxContains" in r["error"]["message"] and r["error"]["param"] == "guided_json", r
            # A set of strings (pydantic's set[str]): uniqueness of general values is not enforceable.
            tags = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                              "uniqueItems": True}}, "required": ["tags"]}
            s, r = complete({"guided_json": tags})
            assert s == 400 and "'uniqueItems' at #/properties/tags" in r["error"]["message"], r
            s, r = complete({"guided_json": {"type": "integer"}, "guided_regex": "a"})
            assert s == 400 and "only one" in r["error"]["message"], r
            s, r = complete({"response_format": {"type": "yaml"}})
            assert s == 400 and r["error"]["param"] == "response_format", r
            s, r = complete({"guided_regex": "(unclosed"})
            assert s == 400, r
            # Hostile nesting is refused before the recursive-descent front-ends see it.
            for field, text in (("guided_regex", "(" * 50000 + "a" + ")" * 50000),
                                ("guided_grammar", "root ::= " + "(" * 50000 + '"a"' + ")" * 50000),
                                ("guided_json", "[" * 50000 + "]" * 50000)):
                s, r = complete({field: text})
                assert s == 400 and "levels" in r["error"]["message"] and r["error"]["param"] == field, r
            s, r = complete({"guided_grammar": 'root ::= root "a" | "b"'})
            assert s == 400 and "left-recursive" in r["error"]["message"], r
            s, r = complete({"guided_json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}})
            assert s == 400, r
            assert requests.get(srv.url + "/health", timeout=10).status_code == 200
        _()

        @check("--structured-output-best-effort: an unenforceable keyword is a warning header, not a 400")
        def _():
            best = Server(args.fathom, model, "--structured-output-best-effort")
            try:
                schema = {"type": "array", "items": {"type": "integer"}, "contains": {}, "maxContains": 1}
                r = requests.post(best.url + "/v1/completions", timeout=120, json={
                    "model": name, "prompt": "Answer:", "guided_json": schema, "max_tokens": 400, "seed": 1})
                assert r.status_code == 200, r.text
                assert "maxContains" in r.headers.get("X-Fathom-Structured-Output-Warning", ""), r.headers
                assert isinstance(json.loads(r.json()["choices"][0]["text"]), list), r.json()
                tags = {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True, "maxItems": 4}
                r = requests.post(best.url + "/v1/completions", timeout=120, json={
                    "model": name, "prompt": "Answer:", "guided_json": tags, "max_tokens": 200, "seed": 1})
                assert r.status_code == 200, r.text
                assert "uniqueItems" in r.headers.get("X-Fathom-Structured-Output-Warning", ""), r.headers
                if r.json()["choices"][0]["finish_reason"] == "stop":  # left unenforced: any strings
                    assert isinstance(json.loads(r.json()["choices"][0]["text"]), list), r.json()
                ok = requests.post(best.url + "/v1/completions", timeout=120, json={
                    "model": name, "prompt": "Answer:", "guided_json": {"type": "integer"}, "max_tokens": 20})
                assert ok.status_code == 200 and "X-Fathom-Structured-Output-Warning" not in ok.headers, ok.headers
            finally:
                best.stop()
        _()

        @check("undeclared keys: free-form objects take any, declared ones only theirs; "
               "disable_additional_properties and --structured-output-undeclared-keys any")
        def _():
            # (The random model rarely ends a free key: a key begun is the evidence it is allowed.)
            declared = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
            free = {"type": "object", "properties": {"m": {"type": "object"}}, "required": ["m"]}
            extra_key = re.compile(r'^\{"a": ?-?[0-9]+, ?"')
            free_keys = 0
            for seed in range(20):
                s, r = complete({"guided_json": declared, "seed": seed, "temperature": 1.0, "max_tokens": 60})
                assert s == 200 and not extra_key.match(r["choices"][0]["text"]), r
                if r["choices"][0]["finish_reason"] == "stop":
                    assert list(json.loads(r["choices"][0]["text"])) == ["a"], r
                s, r = complete({"guided_json": free, "seed": seed, "temperature": 1.0, "max_tokens": 60})
                free_keys += r["choices"][0]["text"].startswith('{"m":{"') or r["choices"][0]["text"].startswith('{"m": {"')
                s, r = complete({"structured_outputs": {"json": {"type": "object"}, "disable_additional_properties": True},
                                 "seed": seed, "temperature": 1.0, "max_tokens": 20})
                assert s == 200 and r["choices"][0]["text"] == "{}", r
            assert free_keys > 0, "no free-form object got a key"
            anyk = Server(args.fathom, model, "--structured-output-undeclared-keys", "any")
            try:
                extra = 0
                for seed in range(20):
                    r = requests.post(anyk.url + "/v1/completions", timeout=120, json={
                        "model": name, "prompt": "Answer:", "guided_json": declared, "seed": seed, "temperature": 1.0,
                        "max_tokens": 60}).json()
                    extra += bool(extra_key.match(r["choices"][0]["text"]))
                    if r["choices"][0]["finish_reason"] == "stop":
                        jsonschema.validate(json.loads(r["choices"][0]["text"]), declared)
                assert extra > 0, "no undeclared key with --structured-output-undeclared-keys any"
            finally:
                anyk.stop()
        _()
    finally:
        srv.stop()
    # Speculative decoding: drafts are verified under the grammar (a draft it refuses is rejected).
    srv = Server(args.fathom, model, "--max-num-seqs", "16", "--speculative-algorithm", "ngram",
                 "--speculative-num-steps", "3")
    try:
        @check("with n-gram drafts: outputs still validate")
        def _():
            def one(seed):
                schema = SCHEMAS[seed % len(SCHEMAS)]
                r = requests.post(srv.url + "/v1/completions", timeout=120, json={
                    "prompt": "Answer:", "guided_json": schema, "temperature": 0, "seed": seed, "max_tokens": 400})
                c = r.json()["choices"][0]
                assert c["finish_reason"] == "stop", c
                jsonschema.validate(json.loads(c["text"]), schema)
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(one, range(50)))
        _()
    finally:
        srv.stop()
    # The runner choosing tokens (the GPU's path on the CPU engine): overlapped steps with deferred
    # masks, and with MTP one draft a round, sampled fused rounds verifying drafts under the grammar.
    for label, extra in (("device sampler", []),
                         ("device sampler, MTP", ["--speculative-algorithm", "mtp", "--speculative-num-steps", "1"])):
        srv = Server(args.fathom, model, "--max-num-seqs", "32", "--sampler", "device", *extra)
        try:
            @check(f"{label}: sampled outputs of every schema validate")
            def _():
                def one(seed):
                    schema = SCHEMAS[seed % len(SCHEMAS)]
                    r = requests.post(srv.url + "/v1/completions", timeout=120, json={
                        "prompt": "Answer:", "structured_outputs": {"json": schema}, "temperature": 1.0, "seed": seed,
                        "max_tokens": 400})
                    c = r.json()["choices"][0]
                    assert c["finish_reason"] == "stop", (seed, c)
                    jsonschema.validate(json.loads(c["text"]), schema)
                with ThreadPoolExecutor(32) as pool:
                    list(pool.map(one, range(8 * len(SCHEMAS))))
                if extra:
                    assert srv.metric("fathom:spec_decode_fused_rounds_total") > 0
            _()
        finally:
            srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
