#!/usr/bin/env python3
"""`fathom serve --chat-template` with the real Qwen3.5 chat template (a snapshot in ../shared, which
the repository must not copy) on the tiny fixture: the template opens thinking in the prompt, so
the reasoning parser sends the output to reasoning_content; streaming equals non-streaming; the
Anthropic and Responses APIs render their conversations as the chat messages they stand for.
Registered by ctest only where ../shared exists.

Run by ctest as: python3 test_qwen35_template_snapshot.py --fathom BIN --shared SHARED --fixtures FIXTURES_DIR
"""
import argparse
import os
import sys

import anthropic
import requests
from tokenizers import Tokenizer

from server_util import Server, check, summary


def qwen35_template_checks(args, model, name, hf):
    """The real Qwen3.5 template (from ../shared, not in the repository): thinking opens in the
    prompt, so the reasoning parser sends the output to reasoning_content."""
    template = os.path.join(args.shared, "fixtures", "chat_templates", "qwen3.5", "chat_template.jinja")
    # The tool-call parser lets /tokenize take tools (as the chat endpoint, it refuses them without).
    srv = Server(args.fathom, model, "--reasoning-parser", "qwen3", "--chat-template", template,
                 "--tool-call-parser", "qwen3_coder", "--enable-auto-tool-choice")
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

        @check("Qwen3.5 template: /v1/messages as the chat request (thinking block, tool round trip rendered alike)")
        def _():
            ac = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0)
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            greedy = {"extra_body": {"temperature": 0}}
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0)
            a = ac.messages.create(model=name, messages=msgs, max_tokens=8, **greedy)
            assert a.content[0].type == "thinking", a.content
            assert a.content[0].thinking == r.choices[0].message.model_extra["reasoning_content"], (a, r)
            off = ac.messages.create(model=name, messages=msgs, max_tokens=8, thinking={"type": "disabled"}, **greedy)
            assert [b.type for b in off.content] == ["text"], off.content
            # The same conversation, Anthropic's blocks and chat's messages, renders to the same tokens.
            tool = {"name": "get_weather", "description": "Weather of a city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
            anth = msgs + [
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look it up.", "signature": ""},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}]}]
            chat = msgs + [
                {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                 "tool_calls": [{"id": "toolu_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}]
            n = ac.messages.count_tokens(model=name, messages=anth, tools=[tool]).input_tokens
            t = requests.post(srv.url + "/tokenize", timeout=30, json={
                "messages": chat, "add_generation_prompt": True, "tools": [{"type": "function", "function": {
                    "name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}}]})
            assert n == t.json()["count"], (n, t.text)
            assert n > len(hf.encode("Sunny Paris get_weather", add_special_tokens=False).ids)
        _()

        @check("Qwen3.5 template: /v1/responses as the chat request (reasoning item, function-call items rendered alike)")
        def _():
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0)
            x = cl.responses.create(model=name, input=msgs, max_output_tokens=8, temperature=0)
            assert x.output[0].type == "reasoning", x.output
            assert x.output[0].content[0].text == r.choices[0].message.model_extra["reasoning_content"], (x, r)
            tool = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
            items = msgs + [
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}]
            chat = msgs + [
                {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
            y = cl.responses.create(model=name, input=items, tools=[tool], tool_choice="auto", max_output_tokens=2)
            t = requests.post(srv.url + "/tokenize", timeout=30, json={
                "messages": chat, "add_generation_prompt": True, "tools": [{"type": "function", "function": {
                    k: v for k, v in tool.items() if k != "type"}}]})
            assert y.usage.input_tokens == t.json()["count"], (y.usage, t.text)
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
