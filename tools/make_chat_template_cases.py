#!/usr/bin/env python3
"""Generates tests/fixtures/chat/cases.json: seeded random conversations rendered with Python
jinja2 under transformers' apply_chat_template conventions (no transformers import needed).

Each case is rendered with every template; the expected output or the raised error is recorded.
The tokenizer folders are read from tests/fixtures/tokenizers, the snapshot chat templates
(Qwen3.5, Qwen3-Coder: never copied into the repository) from ../shared.
Usage: tools/make_chat_template_cases.py [--shared ../shared] [--fixtures tests/fixtures]
                                         [--out tests/fixtures/chat/cases.json]
"""
import argparse
import json
import random
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# name -> folder under the shared dir (chat_template.jinja or tokenizer_config.json), as recorded
# in cases.json. "fixtures/tokenizers/X" is also checked in as tests/fixtures/tokenizers/X;
# "fixtures/chat_templates/X" (a snapshot template) is only in ../shared: see template_folder().
TEMPLATES = {
    "qwen3": "fixtures/tokenizers/qwen3",
    "qwen3.5": "fixtures/chat_templates/qwen3.5",
    "qwen3-coder": "fixtures/chat_templates/qwen3-coder",
    "llama3": "fixtures/tokenizers/llama3",
    "deepseek_v3": "fixtures/tokenizers/deepseek_v3",
    "fathom_default": "fixtures/tokenizers/fathom_default",  # the default model's own (issue 16)
}
SNAPSHOT_PREFIX = "fixtures/chat_templates/"


def is_snapshot(rel: str) -> bool:
    return rel.startswith(SNAPSHOT_PREFIX)


def template_folder(rel: str, fixtures: Path, shared: Path | None):
    """Where the template TEMPLATES names by `rel` lives: tests/fixtures or ../shared."""
    if is_snapshot(rel):
        return shared / rel
    return fixtures / rel[len("fixtures/"):]


SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def load_template(folder: Path):
    """(source, special tokens) the way `fathom chat-template FOLDER` loads them."""
    specials = {}
    cfg_path = folder / "tokenizer_config.json"
    cfg = None
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        for name in SPECIAL_TOKENS:
            tok = cfg.get(name)
            if isinstance(tok, str):
                specials[name] = tok
            elif isinstance(tok, dict) and isinstance(tok.get("content"), str):
                specials[name] = tok["content"]
    jinja_path = folder / "chat_template.jinja"
    if jinja_path.exists():
        return jinja_path.read_text(encoding="utf-8"), specials
    ct = cfg["chat_template"]
    if isinstance(ct, list):
        ct = next(t["template"] for t in ct if t.get("name") == "default")
    return ct, specials


def make_env():
    """Replica of transformers.utils.chat_template_utils._cached_compile_jinja_template."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, specials, case):
    """apply_chat_template(messages, tools, add_generation_prompt, **kwargs) -> (text, error)."""
    try:
        tmpl = env.from_string(source)
        kwargs = {**specials, **case.get("kwargs", {})}
        out = tmpl.render(messages=case["messages"], tools=case.get("tools"), documents=None,
                          add_generation_prompt=case["add_generation_prompt"], **kwargs)
        return out, None
    except Exception as e:  # noqa: BLE001 - any failure is an expectation to record
        return None, {"type": type(e).__name__, "message": str(e)}


# ---------------------------------------------------------------- random conversations

WORDS = ["the", "model", "weather", "Paris", "token", "cache", "résumé", "naïve", "Größe", "東京", "数据", "😀", "🚀",
         "emoji👍🏽", "кот", "مرحبا", "λ", "x<y", "a&b", "\"quoted\"", "'single'", "back\\slash", "tab\there", "{{ not jinja }}",
         "{% raw %}", "<think>", "100%", "$HOME", "line\nbreak", "  spaced  ", "C++", "naïve café", "NaN", "null"]

TOOL_POOL = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a given location — données météo 🌦️",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search_documents", "description": "  Search the knowledge base.\n\nReturns ranked hits.  ",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Free text query"},
            "filters": {"type": "object", "description": "Structured filters", "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "tags": {"type": "array", "items": {"type": "string"}}}},
            "top_k": {"type": "integer", "default": 5}},
            "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "run_python", "description": "Execute Python code in a sandbox and return stdout.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "Source code"},
            "timeout": {"type": ["number", "null"], "description": "Seconds"}}, "required": ["code"]}}},
    {"type": "function", "function": {
        "name": "translate", "description": "翻译文本 / Translate text",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string"},
            "target": {"type": "string", "enum": ["en", "fr", "zh", "ja"], "description": "ISO code"},
            "formality": {"type": "number", "description": "0.0 to 1.0", "default": 0.5}},
            "required": ["text", "target"]}}},
    {"type": "function", "function": {"name": "no_params", "description": "A tool without parameters",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def sentence(rng, lo=1, hi=12):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def content_value(rng, allow_parts=True, allow_empty=True):
    r = rng.random()
    if allow_empty and r < 0.06:
        return ""
    if allow_parts and r < 0.18:
        return [{"type": "text", "text": sentence(rng)} for _ in range(rng.randint(1, 3))]
    return sentence(rng)


def tool_args(rng, tool):
    props = tool["function"]["parameters"].get("properties", {})
    args = {}
    for name, spec in props.items():
        if rng.random() < 0.3:
            continue
        t = spec.get("type")
        if "enum" in spec:
            args[name] = rng.choice(spec["enum"])
        elif t == "integer":
            args[name] = rng.randint(-5, 2000)
        elif t == "number" or t == ["number", "null"]:
            args[name] = rng.choice([0.5, 1.0, 2.25, 1e-7, 3, None])
        elif t == "object":
            args[name] = {"year": rng.randint(1990, 2024), "tags": [sentence(rng, 1, 2) for _ in range(rng.randint(0, 2))]}
        elif t == "array":
            args[name] = [sentence(rng, 1, 2)]
        else:
            args[name] = sentence(rng, 1, 5)
    return args


def make_case(rng, idx):
    tools = rng.sample(TOOL_POOL, rng.randint(1, 3)) if rng.random() < 0.45 else None
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": content_value(rng, allow_parts=rng.random() < 0.3)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        messages.append({"role": "user", "content": content_value(rng)})
        last = t == turns - 1
        if last and rng.random() < 0.4:
            break  # ends on a user turn
        msg = {"role": "assistant"}
        r = rng.random()
        if r < 0.2:
            msg["content"] = "<think>\n" + sentence(rng) + "\n</think>\n\n" + sentence(rng)
        else:
            msg["content"] = content_value(rng, allow_parts=False)
        if rng.random() < 0.3:
            msg["reasoning_content"] = sentence(rng) if rng.random() < 0.85 else None
        if tools and rng.random() < 0.6:
            calls = []
            for _ in range(rng.randint(1, 3)):
                tool = rng.choice(tools)
                args = tool_args(rng, tool)
                as_string = rng.random() < 0.3
                fn = {"name": tool["function"]["name"],
                      "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}
                calls.append({"id": f"call_{idx}_{len(calls)}", "type": "function", "function": fn})
            msg["tool_calls"] = calls
            if rng.random() < 0.35:
                msg["content"] = None if rng.random() < 0.6 else ""
            messages.append(msg)
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"],
                                 "content": json.dumps({"result": sentence(rng, 1, 4)}, ensure_ascii=False)
                                 if rng.random() < 0.7 else sentence(rng)})
            if rng.random() < 0.6:
                messages.append({"role": "assistant", "content": sentence(rng)})
        else:
            messages.append(msg)
    case = {"id": f"random_{idx:03d}", "messages": messages, "tools": tools,
            "add_generation_prompt": rng.random() < 0.6, "kwargs": {}}
    r = rng.random()
    if r < 0.33:
        case["kwargs"]["enable_thinking"] = False
    elif r < 0.66:
        case["kwargs"]["enable_thinking"] = True
    return case


def fixed_cases():
    tool = TOOL_POOL[0]
    return [
        {"id": "empty_messages", "messages": [], "tools": None, "add_generation_prompt": True, "kwargs": {}},
        {"id": "system_only", "messages": [{"role": "system", "content": "You are helpful."}], "tools": None,
         "add_generation_prompt": True, "kwargs": {}},
        {"id": "single_user", "messages": [{"role": "user", "content": "Hello!"}], "tools": None,
         "add_generation_prompt": True, "kwargs": {}},
        {"id": "single_user_no_think", "messages": [{"role": "user", "content": "Hello!"}], "tools": None,
         "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
        {"id": "tools_no_system", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool],
         "add_generation_prompt": True, "kwargs": {}},
        {"id": "tools_with_system", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Weather in Paris?"}],
         "tools": TOOL_POOL, "add_generation_prompt": False, "kwargs": {}},
        {"id": "tool_roundtrip", "messages": [
            {"role": "user", "content": "Weather in Paris and Tokyo?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need two calls.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Tokyo\"}"}}]},
            {"role": "tool", "content": "{\"temp\": 21}"},
            {"role": "tool", "content": "{\"temp\": 25}"},
            {"role": "assistant", "content": "Paris 21°C, Tokyo 25°C."}],
         "tools": [tool], "add_generation_prompt": False, "kwargs": {}},
        {"id": "only_tool_messages", "messages": [{"role": "tool", "content": "x"}], "tools": None,
         "add_generation_prompt": False, "kwargs": {}},
        {"id": "tool_response_user", "messages": [
            {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
            {"role": "user", "content": "<tool_response>\nr\n</tool_response>"}],
         "tools": None, "add_generation_prompt": True, "kwargs": {}},
        {"id": "think_in_content", "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n4"},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"}],
         "tools": None, "add_generation_prompt": False, "kwargs": {}},
        {"id": "content_parts", "messages": [
            {"role": "system", "content": [{"type": "text", "text": "sys part"}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         "tools": None, "add_generation_prompt": True, "kwargs": {}},
        {"id": "image_part", "messages": [
            {"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "What is it?"}]}],
         "tools": None, "add_generation_prompt": True, "kwargs": {}},
        {"id": "unknown_role", "messages": [{"role": "user", "content": "hi"}, {"role": "critic", "content": "meh"}],
         "tools": None, "add_generation_prompt": False, "kwargs": {}},
        {"id": "system_not_first", "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}],
         "tools": None, "add_generation_prompt": False, "kwargs": {}},
        {"id": "deepseek_tool_style", "messages": [
            {"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                {"type": "function", "function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"},
            {"role": "assistant", "content": "done"}],
         "tools": None, "add_generation_prompt": True, "kwargs": {}},
        {"id": "unicode_heavy", "messages": [
            {"role": "user", "content": "  \u3000全角スペース\u00a0nbsp\u2028sep 🚀👩‍👩‍👧  "},
            {"role": "assistant", "content": "\n\nleading newlines é"}],
         "tools": None, "add_generation_prompt": True, "kwargs": {"enable_thinking": True}},
    ]


def build_cases(seed, count):
    rng = random.Random(seed)
    return [make_case(rng, k) for k in range(count)]


def main():
    here = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(here.parent / "shared"))
    ap.add_argument("--fixtures", default=str(here / "tests/fixtures"))
    ap.add_argument("--out", default=str(here / "tests/fixtures/chat/cases.json"))
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--count", type=int, default=70)
    args = ap.parse_args()
    env = make_env()
    templates = {name: load_template(template_folder(rel, Path(args.fixtures), Path(args.shared)))
                 for name, rel in TEMPLATES.items()}
    cases = fixed_cases() + build_cases(args.seed, args.count)
    expected = []
    n_err = 0
    for ci, case in enumerate(cases):
        for name, (src, specials) in templates.items():
            out, err = render(env, src, specials, case)
            rec = {"case": ci, "template": name}
            if err:
                rec["error"] = err
                n_err += 1
            else:
                rec["output"] = out
            expected.append(rec)
    doc = {"generator": "tools/make_chat_template_cases.py", "seed": args.seed,
           "templates": TEMPLATES, "cases": cases, "expected": expected}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases x {len(templates)} templates: {len(expected) - n_err} renders, {n_err} errors "
          f"-> {args.out} ({Path(args.out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
