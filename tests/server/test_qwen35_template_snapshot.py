#!/usr/bin/env python3
"""`fathom serve --chat-template` with the real Qwen3.5 chat template (a snapshot in ../shared, which
the repository must not copy) on the tiny fixture: the template opens thinking in the prompt, so
the reasoning parser sends the output to reasoning_content; streaming equals non-streaming.
Registered by ctest only where ../shared exists.

Run by ctest as: python3 test_qwen35_template_snapshot.py --fathom BIN --shared SHARED --fixtures FIXTURES_DIR
"""
import argparse
import os
import sys

from tokenizers import Tokenizer

from server_util import Server, check, summary


def qwen35_template_checks(args, model, name, hf):
    """The real Qwen3.5 template (from ../shared, not in the repository): thinking opens in the
    prompt, so the reasoning parser sends the output to reasoning_content."""
    template = os.path.join(args.shared, "fixtures", "chat_templates", "qwen3.5", "chat_template.jinja")
    srv = Server(args.fathom, model, "--reasoning-parser", "qwen3", "--chat-template", template)
    try:
        cl = srv.client()

        @check("Qwen3.5 template (--chat-template): reasoning split, streaming equals non-streaming")
        def _():
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0)
            m = r.choices[0].message
            rc = m.model_extra.get("reasoning_content")
            assert rc and r.usage.completion_tokens == 8, m
            tmpl_prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n<think>\n"
            assert r.usage.prompt_tokens == len(hf.encode(tmpl_prompt, add_special_tokens=False).ids)
            r2 = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            assert r2.choices[0].message.content and not r2.choices[0].message.model_extra.get("reasoning_content")
            assert r2.usage.prompt_tokens == len(hf.encode(tmpl_prompt + "\n</think>\n\n", add_special_tokens=False).ids)
            rs, cs = "", ""
            for ch in cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0, stream=True):
                for c in ch.choices:
                    rs += (c.delta.model_extra or {}).get("reasoning_content") or ""
                    cs += c.delta.content or ""
            assert rs == (rc or "") and cs == (m.content or ""), (rs, rc, cs, m.content)
        _()
    finally:
        srv.stop()




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    model = os.path.join(args.fixtures, "qwen35_moe")
    hf = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    qwen35_template_checks(args, model, model, hf)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
