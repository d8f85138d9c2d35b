#!/usr/bin/env python3
"""Renders fresh random conversations (seeded by today's date) with Python jinja2 under
transformers' conventions and with `fathom chat-template`, and compares them byte for byte.

Run by ctest as: test_chat_template_vs_jinja2.py --fathom BIN --shared SHARED --fixtures FIXTURES
Prints 'N passed, M failed'; exits non-zero on any mismatch.
"""
import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import make_chat_template_cases as gen  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--fixtures", default=None)
    ap.add_argument("--seed", type=int, default=int(datetime.date.today().strftime("%Y%m%d")))
    ap.add_argument("--count", type=int, default=40)
    args = ap.parse_args()

    shared = Path(args.shared)
    env = gen.make_env()
    templates = {name: (shared / rel, *gen.load_template(shared / rel)) for name, rel in gen.TEMPLATES.items()}
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
