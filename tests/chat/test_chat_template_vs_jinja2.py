#!/usr/bin/env python3
"""Renders random conversations (a fixed seed by default, --seed N for another set) with Python
jinja2 under transformers' conventions and with `fathom chat-template`, and compares them byte
for byte. The Qwen3/Llama 3/DeepSeek V3 templates come from FIXTURES/tokenizers; with --shared
(test_chat_template_vs_jinja2_snapshot.py, registered where ../shared exists) the snapshot
templates (Qwen3.5, Qwen3-Coder), which the repository must not copy, are tested instead.

Run by ctest as: test_chat_template_vs_jinja2.py --fathom BIN --fixtures FIXTURES
Prints 'N passed, M failed'; exits non-zero on any mismatch or when `jinja2` is not importable.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SEED = 20250611  # fixed so that a run is reproducible; --seed N renders another set


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--shared", default=None, help="the shared dir: test its snapshot templates only")
    ap.add_argument("--fixtures", default=str(Path(__file__).resolve().parents[1] / "fixtures"))
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--count", type=int, default=40)
    args = ap.parse_args()
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
        import make_chat_template_cases as gen  # imports jinja2
    except ImportError as e:
        print(f"FAIL: the reference package `jinja2` is not importable by {sys.executable} ({e}); "
              "scripts/install_deps.sh installs it into .venv")
        print("0 passed, 1 failed")
        return 1

    fixtures = Path(args.fixtures)
    shared = Path(args.shared) if args.shared else None
    env = gen.make_env()
    templates = {}
    for name, rel in gen.TEMPLATES.items():
        if gen.is_snapshot(rel) != (shared is not None):
            continue
        folder = gen.template_folder(rel, fixtures, shared)
        templates[name] = (folder, *gen.load_template(folder))
    print(f"templates: {', '.join(templates)}")
    cases = gen.build_cases(args.seed, args.count)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            msg_file = Path(tmp) / "messages.json"
            msg_file.write_text(json.dumps(case["messages"], ensure_ascii=False), encoding="utf-8")
            cmd_tail = ["--messages", str(msg_file)]
            if case["tools"] is not None:
                tools_file = Path(tmp) / "tools.json"
                tools_file.write_text(json.dumps(case["tools"], ensure_ascii=False), encoding="utf-8")
                cmd_tail += ["--tools", str(tools_file)]
            if case["add_generation_prompt"]:
                cmd_tail.append("--add-generation-prompt")
            if case["kwargs"].get("enable_thinking") is False:
                cmd_tail.append("--no-thinking")
            elif case["kwargs"]:
                cmd_tail += ["--kwargs", json.dumps(case["kwargs"])]
            for name, (folder, source, specials) in templates.items():
                want, err = gen.render(env, source, specials, case)
                proc = subprocess.run([args.fathom, "chat-template", str(folder)] + cmd_tail, capture_output=True)
                got = proc.stdout.decode("utf-8", errors="replace")
                label = f"seed {args.seed} {case['id']} / {name}"
                if err is not None:
                    ok = proc.returncode != 0
                    if ok and err["type"] == "TemplateError" and err["message"] not in proc.stderr.decode("utf-8", "replace"):
                        ok = False
                    if not ok:
                        print(f"FAIL {label}: Python raised {err['type']}: {err['message']}; fathom rc={proc.returncode} "
                              f"stderr={proc.stderr.decode('utf-8', 'replace').strip()!r}")
                elif proc.returncode != 0:
                    ok = False
                    print(f"FAIL {label}: fathom failed: {proc.stderr.decode('utf-8', 'replace').strip()}")
                else:
                    ok = got == want
                    if not ok:
                        k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                        print(f"FAIL {label}: first difference at char {k}\n  expected: {want[max(0, k - 60):k + 80]!r}\n"
                              f"  got:      {got[max(0, k - 60):k + 80]!r}")
                passed += ok
                failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
