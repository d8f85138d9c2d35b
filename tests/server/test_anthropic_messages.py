"""`fathom serve` on the default model (models/fathom-tiny-moe) through the official `anthropic`
SDK: /v1/messages answers with the text /v1/chat/completions gives for the same request (both
greedy), streamed or not; stop_sequences, max_tokens and tool use end with Anthropic's
stop_reason; a forced tool call makes a tool_use block whose result goes back as tool_result;
thinking (--reasoning-parser qwen3) comes as thinking blocks; x-api-key and Bearer both
authenticate; errors come in Anthropic's shape and the server keeps serving;
/v1/messages/count_tokens agrees with usage. Also the small endpoints: /detokenize, /version and
/v1/models/{id}.

Run by ctest as: python3 test_anthropic_messages.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import json
import os
import sys

import anthropic
import requests

import server_util
from server_util import Server, check, named_events, summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "fathom-tiny-moe")
KEY = "sekret-36"
# The SDK no longer has sampling arguments (Claude models fix them); the server still takes them.
GREEDY = {"extra_body": {"temperature": 0}}
MSGS = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def raw_events(srv, body):
    """The (event name, data) pairs of a streamed /v1/messages response, checked as SSE."""
    return named_events(srv.url + "/v1/messages", body, {"x-api-key": KEY})


def error_of(fn):
    return server_util.error_of(fn, anthropic.APIStatusError)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    srv = Server(args.fathom, MODEL, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                 "--enable-auto-tool-choice", "--api-key", KEY)
    try:
        ac = anthropic.Anthropic(base_url=srv.url, api_key=KEY, max_retries=0, timeout=60)
        oc = srv.client(KEY)
        name = oc.models.list().data[0].id
        seen = {}

        @check("text: the chat completion's answer, with usage and stop_reason")
        def _():
            chat = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=48, temperature=0)
            m = ac.messages.create(model=name, messages=MSGS, max_tokens=48, **GREEDY)
            assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
            assert [b.type for b in m.content] == ["text"], m.content
            assert m.content[0].text == chat.choices[0].message.content, (m.content[0].text, chat)
            want = {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
            assert m.stop_reason == want and m.stop_sequence is None, m
            assert m.usage.input_tokens == chat.usage.prompt_tokens, (m.usage, chat.usage)
            assert m.usage.output_tokens == chat.usage.completion_tokens, (m.usage, chat.usage)
            seen["text"], seen["message"] = m.content[0].text, m
        _()

        @check("streaming: the SDK's stream gives the same message")
        def _():
            with ac.messages.stream(model=name, messages=MSGS, max_tokens=48, **GREEDY) as s:
                text = "".join(s.text_stream)
                final = s.get_final_message()
            assert text == seen["text"], (text, seen["text"])
            assert final.content[0].text == text and final.stop_reason == seen["message"].stop_reason, final
            assert final.usage.output_tokens == seen["message"].usage.output_tokens, final.usage
            evs = [n for n, _ in raw_events(srv, {"model": name, "messages": MSGS, "max_tokens": 8, "stream": True})]
            assert evs[:2] == ["message_start", "ping"] and evs[-2:] == ["message_delta", "message_stop"], evs
            assert evs[2] == "content_block_start" and evs[-3] == "content_block_stop", evs
        _()

        @check("max_tokens: stop_reason max_tokens, streamed or not")
        def _():
            m = ac.messages.create(model=name, messages=MSGS, max_tokens=3, **GREEDY)
            assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3, m
            evs = raw_events(srv, {"model": name, "messages": MSGS, "max_tokens": 3, "stream": True})
            delta = [d for n, d in evs if n == "message_delta"][0]
            assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 3, delta
        _()

        @check("stop_sequences: the text stops before it, stop_reason stop_sequence")
        def _():
            words = seen["text"].split()
            stop = words[min(3, len(words) - 1)]
            m = ac.messages.create(model=name, messages=MSGS, max_tokens=48, **GREEDY, stop_sequences=[stop])
            assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop, m
            got = m.content[0].text if m.content else ""
            assert seen["text"].startswith(got) and stop not in got, (got, stop)
            with ac.messages.stream(model=name, messages=MSGS, max_tokens=48, **GREEDY, stop_sequences=[stop]) as s:
                final = s.get_final_message()
            assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop, final
        _()

        @check("tool use: a forced call, its result back, streamed input_json")
        def _():
            m = ac.messages.create(model=name, messages=MSGS, max_tokens=64, **GREEDY, tools=TOOLS,
                                   tool_choice={"type": "tool", "name": "get_weather"})
            uses = [b for b in m.content if b.type == "tool_use"]
            assert m.stop_reason == "tool_use" and len(uses) == 1, m
            assert uses[0].name == "get_weather" and isinstance(uses[0].input.get("city"), str), uses[0]
            with ac.messages.stream(model=name, messages=MSGS, max_tokens=64, **GREEDY, tools=TOOLS,
                                    tool_choice={"type": "tool", "name": "get_weather"}) as s:
                final = s.get_final_message()
            su = [b for b in final.content if b.type == "tool_use"]
            assert final.stop_reason == "tool_use" and su and su[0].input == uses[0].input, (final, uses)
            anyone = ac.messages.create(model=name, messages=MSGS, max_tokens=128, **GREEDY, tools=TOOLS,
                                        tool_choice={"type": "any", "disable_parallel_tool_use": True})
            au = [b for b in anyone.content if b.type == "tool_use"]
            assert anyone.stop_reason == "tool_use" and len(au) == 1 and au[0].name == "get_weather", anyone
            back = MSGS + [{"role": "assistant", "content": m.content},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                         "content": "Cold and windy."}]}]
            r = ac.messages.create(model=name, messages=back, max_tokens=16, **GREEDY, tools=TOOLS,
                                   tool_choice={"type": "none"})
            assert r.stop_reason in ("end_turn", "max_tokens") and not [b for b in r.content if b.type == "tool_use"], r
            n = ac.messages.count_tokens(model=name, messages=back, tools=TOOLS).input_tokens
            bigger = ac.messages.count_tokens(model=name, messages=back + [{"role": "assistant", "content": "x y z"}],
                                              tools=TOOLS).input_tokens
            assert n > 0 and bigger > n, (n, bigger)
        _()

        @check("thinking: thinking blocks from the reasoning parser, streamed as thinking_delta")
        def _():
            think = {"type": "enabled", "budget_tokens": 16}
            m = ac.messages.create(model=name, messages=MSGS, max_tokens=24, **GREEDY, thinking=think)
            chat = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=24, temperature=0,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": True}})
            reasoning = chat.choices[0].message.model_extra["reasoning_content"]
            assert reasoning and m.content[0].type == "thinking" and m.content[0].thinking == reasoning, (m, chat)
            evs = raw_events(srv, {"model": name, "messages": MSGS, "max_tokens": 24, "stream": True, "thinking": think,
                                   "temperature": 0})
            starts = [d["content_block"]["type"] for n, d in evs if n == "content_block_start"]
            streamed = "".join(d["delta"]["thinking"] for n, d in evs
                               if n == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
            assert starts[0] == "thinking" and streamed == reasoning, (starts, streamed)
            off = ac.messages.create(model=name, messages=MSGS, max_tokens=24, **GREEDY, thinking={"type": "disabled"})
            assert [b.type for b in off.content] == ["text"], off.content
        _()

        @check("auth: x-api-key and Bearer on /v1/messages, a wrong key is Anthropic's 401")
        def _():
            bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
            e = error_of(lambda: bad.messages.create(model=name, messages=MSGS, max_tokens=2))
            assert e.status_code == 401 and e.body["type"] == "error", e.body
            assert e.body["error"]["type"] == "authentication_error", e.body
            bearer = anthropic.Anthropic(base_url=srv.url, auth_token=KEY, max_retries=0)
            assert bearer.messages.create(model=name, messages=MSGS, max_tokens=2).stop_reason == "max_tokens"
            r = requests.post(srv.url + "/v1/chat/completions", headers={"x-api-key": KEY},
                              json={"model": name, "messages": MSGS, "max_tokens": 2}, timeout=30)
            assert r.status_code == 401 and "error" in r.json(), r.text  # OpenAI's routes: Bearer only
        _()

        @check("errors: Anthropic's shape naming the field; the server keeps serving")
        def _():
            cases = [
                (lambda: ac.messages.create(model=name, messages=MSGS, max_tokens=4, extra_body={"n": 2}), "'n'"),
                (lambda: ac.messages.create(model=name, messages=[], max_tokens=4), "messages"),
                (lambda: ac.messages.create(model=name, messages=MSGS, max_tokens=4, extra_body={"temperature": -1}), "temperature"),
                (lambda: ac.messages.create(model="claude-x", messages=MSGS, max_tokens=4), "claude-x"),
                (lambda: ac.messages.create(model=name, messages=MSGS, max_tokens=4, tools=TOOLS,
                                            tool_choice={"type": "tool", "name": "nope"}), "nope"),
                (lambda: ac.messages.create(model=name, messages=[{"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}],
                    max_tokens=4), "image"),
            ]
            for fn, needle in cases:
                e = error_of(fn)
                assert e.status_code == 400 and e.body["type"] == "error", e.body
                assert e.body["error"]["type"] == "invalid_request_error" and needle in e.body["error"]["message"], e.body
            ok = {"model": name, "max_tokens": 4, "messages": MSGS}
            bodies = [b"{not json", b"[]", b'"x"', b"{" * 100 + b"}" * 100] + [json.dumps(b).encode() for b in (
                {**ok, "max_tokens": "4"}, {**ok, "max_tokens": -1}, {**ok, "messages": "hi"},
                {**ok, "messages": [{"role": "user"}]}, {**ok, "messages": [{"role": "tool", "content": "x"}]},
                {**ok, "messages": [{"role": "user", "content": [{"type": 5}]}]},
                {**ok, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
                {**ok, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f",
                                                                       "input": [1]}]}]},
                {**ok, "system": 5}, {**ok, "stop_sequences": [""]}, {**ok, "stop_sequences": [1]},
                {**ok, "top_p": 2}, {**ok, "top_k": "a"}, {**ok, "stream": 1}, {**ok, "tools": {}},
                {**ok, "tools": [{"name": "f", "input_schema": 3}]}, {**ok, "tool_choice": "auto"},
                {**ok, "tool_choice": {"type": "any"}}, {**ok, "thinking": {"type": "enabled", "budget_tokens": 99}},
                {**ok, "metadata": []}, {**ok, "model": 7})]
            for body in bodies:
                r = requests.post(srv.url + "/v1/messages", data=body, headers={"x-api-key": KEY}, timeout=30)
                assert r.status_code == 400 and r.json()["type"] == "error", (body, r.text)
                assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"], r.text
            r = requests.post(srv.url + "/v1/messages", json={"model": name, "messages": MSGS},
                              headers={"x-api-key": KEY}, timeout=30)
            assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"], r.text
            assert ac.messages.create(model=name, messages=MSGS, max_tokens=2).stop_reason == "max_tokens"
        _()

        @check("count_tokens: the prompt /v1/messages runs")
        def _():
            n = ac.messages.count_tokens(model=name, messages=MSGS).input_tokens
            assert n == seen["message"].usage.input_tokens, (n, seen["message"].usage)
            e = error_of(lambda: ac.messages.count_tokens(model=name, messages=MSGS, extra_body={"max_tokens": 3}))
            assert e.status_code == 400 and "max_tokens" in e.body["error"]["message"], e.body
        _()

        @check("small endpoints: /detokenize, /version, /v1/models/{id}")
        def _():
            h = {"Authorization": "Bearer " + KEY}
            text = "The sea is wide."
            ids = requests.post(srv.url + "/tokenize", json={"prompt": text}, timeout=10).json()["tokens"]
            r = requests.post(srv.url + "/detokenize", json={"model": name, "tokens": ids}, timeout=10)
            assert r.status_code == 200 and r.json() == {"prompt": text}, r.text
            r = requests.post(srv.url + "/detokenize", json={"tokens": [-1]}, timeout=10)
            assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text
            v = requests.get(srv.url + "/version", timeout=10).json()
            assert isinstance(v["version"], str) and v["version"], v
            assert oc.models.retrieve(name).id == name
            r = requests.get(srv.url + "/v1/models/no-such-model", headers=h, timeout=10)
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
            assert requests.get(srv.url + "/v1/models/" + name, timeout=10).status_code == 401  # behind the key
        _()
        assert srv.alive()
    finally:
        srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
