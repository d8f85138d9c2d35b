"""`fathom serve` on the embedded default model (models/fathom-tiny-moe, trained on English text):
/v1/chat/completions answers with text, the same text `fathom chat` prints for the same message
(both greedy, through the model's own chat template), streaming gives the same text, and the
answer reads as words (mostly letters and spaces, nothing the tokenizer could not decode); with
--tool-call-parser hermes --enable-auto-tool-choice, requests with tools get well-formed responses;
tool_choice "required" cut by max_tokens anywhere gives the calls completed before the cut (none
inside the first), never the partial list as text, whole and streamed.

Run by ctest as: python3 test_default_model_serve.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import json
import os
import subprocess
import sys

from server_util import Server, check, summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "fathom-tiny-moe")
QUESTION = "Tell me about the sea."


def reads_as_text(s):
    letters = sum(c.isalpha() or c.isspace() for c in s)
    return len(s) >= 8 and "\ufffd" not in s and letters >= 0.7 * len(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    # The default model's chat template writes hermes-style <tool_call> JSON.
    srv = Server(args.fathom, MODEL, "--tool-call-parser", "hermes", "--enable-auto-tool-choice")
    try:
        cl = srv.client()
        name = cl.models.list().data[0].id
        msgs = [{"role": "user", "content": QUESTION}]
        answer = {}

        @check("chat completion answers with text")
        def _():
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=64, temperature=0)
            text = r.choices[0].message.content
            assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
            assert reads_as_text(text), repr(text)
            answer["text"] = text
            print(f"  answer: {text!r}")
        _()

        @check("the served answer is fathom chat's")
        def _():
            out = subprocess.run([args.fathom, "chat", MODEL, "--device", "cpu", "--prompt", QUESTION,
                                  "--max-new-tokens", "64"], capture_output=True, text=True, timeout=120, check=True)
            assert out.stdout.strip() == answer["text"].strip(), (out.stdout, answer["text"])
        _()

        @check("streaming gives the same text")
        def _():
            parts = []
            for ch in cl.chat.completions.create(model=name, messages=msgs, max_tokens=64, temperature=0, stream=True):
                for c in ch.choices:
                    parts.append(c.delta.content or "")
            assert "".join(parts) == answer["text"], ("".join(parts), answer["text"])
        _()

        @check("tools: a well-formed response through the openai client")
        def _():
            tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                       "parameters": {"type": "object", "properties": {
                                                           "city": {"type": "string"}}, "required": ["city"]}}}]
            r = cl.chat.completions.create(model=name, messages=msgs, tools=tools, max_tokens=32, temperature=0)
            m = r.choices[0].message
            # This model has never seen a tool call; whatever it writes, the response is valid.
            assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r.choices[0].finish_reason
            assert (r.choices[0].finish_reason == "tool_calls") == bool(m.tool_calls), r
            for t in m.tool_calls or []:
                assert isinstance(json.loads(t.function.arguments), dict)
            none = cl.chat.completions.create(model=name, messages=msgs, tools=tools, tool_choice="none", max_tokens=8,
                                              temperature=0)
            assert none.choices[0].finish_reason in ("stop", "length") and not none.choices[0].message.tool_calls
        _()

        @check("tool_choice required cut by max_tokens: the complete calls, never the partial list as text")
        def _():
            tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
                "type": "object", "properties": {p: {"type": "string"}}, "required": [p]}}}
                     for n, d, p in (("get_weather", "Weather of a city", "city"), ("get_time", "Time in a zone", "zone"))]
            q = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]

            def ask(max_tokens, stream=False):
                return cl.chat.completions.create(model=name, messages=q, tools=tools, tool_choice="required",
                                                  max_tokens=max_tokens, temperature=0, stream=stream)

            def calls_of(msg):
                return [(t.function.name, t.function.arguments) for t in msg.tool_calls or []]

            full = ask(160)
            want = calls_of(full.choices[0].message)
            assert want, full
            complete = set()
            for m in range(1, full.usage.completion_tokens, 5):
                c = ask(m).choices[0]
                got = calls_of(c.message)
                assert c.finish_reason == "length", (m, c)
                assert c.message.content is None, (m, c.message.content)
                assert got == want[:len(got)], (m, got, want)
                complete.add(len(got))
            # Cuts inside the first call (no calls) and after complete ones were both seen.
            assert 0 in complete and max(complete) >= 1, complete
            m = next(m for m in range(1, full.usage.completion_tokens) if calls_of(ask(m).choices[0].message))
            streamed, finish = [], None
            for ch in ask(m, stream=True):
                for c in ch.choices:
                    assert not c.delta.content, c.delta
                    for t in c.delta.tool_calls or []:
                        streamed.append((t.function.name, t.function.arguments))
                    finish = c.finish_reason or finish
            assert streamed == calls_of(ask(m).choices[0].message) and finish == "length", (streamed, finish)
            print(f"  {len(want)} calls in {full.usage.completion_tokens} tokens; cuts kept {sorted(complete)} calls")
        _()
    finally:
        srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
