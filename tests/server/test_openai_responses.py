"""`fathom serve` on the default model (models/fathom-tiny-moe) through the official `openai` SDK's
Responses API: /v1/responses answers with the text /v1/chat/completions gives for the same request
(both greedy), streamed (the SDK's stream helper and the raw event sequence) or not; max_output_tokens
makes an incomplete response; a forced function call makes a function_call item whose output goes
back as a function_call_output item; text.format json_schema gives JSON the schema accepts
(checked with jsonschema); the reasoning parser's text comes as a reasoning item; previous_response_id
continues a stored conversation (store false, unknown ids and a server without a store are
refused); malformed requests get OpenAI's error shape naming the field and the server keeps serving.

Text, streaming, a function-call round trip, text.format and reasoning run on the random fixture
(qwen35_moe) too.

Run by ctest as: python3 test_openai_responses.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import json
import os
import sys

import jsonschema
import openai
import requests

import server_util
from server_util import Server, check, named_events, summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "fathom-tiny-moe")
MSGS = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]


def raw_events(srv, body):
    """The (event name, data) pairs of a streamed /v1/responses response, checked as SSE."""
    return named_events(srv.url + "/v1/responses", body)


def error_of(fn):
    return server_util.error_of(fn, openai.APIStatusError)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    srv = Server(args.fathom, MODEL, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                 "--enable-auto-tool-choice", "--responses-store-size", "4")
    try:
        oc = srv.client()
        name = oc.models.list().data[0].id
        seen = {}

        @check("text: the chat completion's answer, with usage, status and output_text")
        def _():
            chat = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=40, temperature=0)
            r = oc.responses.create(model=name, input=MSGS, max_output_tokens=40, temperature=0)
            assert r.object == "response" and r.id.startswith("resp_"), r
            assert [o.type for o in r.output] == ["message"], r.output
            assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)
            want = {"length": "incomplete", "stop": "completed"}[chat.choices[0].finish_reason]
            assert r.status == want, r
            if want == "incomplete":
                assert r.incomplete_details.reason == "max_output_tokens", r
            assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
            assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
            assert r.max_output_tokens == 40 and r.temperature == 0 and r.store is True, r
            same = oc.responses.create(model=name, input="Tell me about the sea.", max_output_tokens=40, temperature=0)
            assert same.output_text == r.output_text  # a string input is one user message
            ins = oc.responses.create(model=name, input=MSGS, instructions="Answer in French.", max_output_tokens=40,
                                      temperature=0)
            with_sys = oc.chat.completions.create(model=name, temperature=0, max_tokens=40,
                                                  messages=[{"role": "system", "content": "Answer in French."}] + MSGS)
            assert ins.output_text == with_sys.choices[0].message.content and ins.instructions == "Answer in French."
            seen["text"] = r
        _()

        @check("streaming: the SDK's stream helper and the raw events give the same response")
        def _():
            # (get_final_response() wants response.completed; a response cut at max_output_tokens ends
            # with response.incomplete, whose Response the events carry.)
            deltas, final = [], None
            with oc.responses.stream(model=name, input=MSGS, max_output_tokens=40, temperature=0) as s:
                for e in s:
                    if e.type == "response.output_text.delta":
                        deltas.append(e.delta)
                    elif e.type in ("response.completed", "response.incomplete"):
                        final = e.response
            assert final.output_text == seen["text"].output_text == "".join(deltas), (final, deltas)
            evs = raw_events(srv, {"model": name, "input": MSGS, "max_output_tokens": 40, "temperature": 0,
                                   "stream": True})
            names = [n for n, _ in evs]
            assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                                 "response.content_part.added"], names
            assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                                  "response.completed" if seen["text"].status == "completed" else "response.incomplete"]
            assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
            last = evs[-1][1]["response"]
            assert last["usage"]["output_tokens"] == seen["text"].usage.output_tokens, last
        _()

        @check("max_output_tokens: an incomplete response, streamed or not")
        def _():
            r = oc.responses.create(model=name, input=MSGS, max_output_tokens=3, temperature=0)
            assert r.status == "incomplete" and r.usage.output_tokens == 3, r
            evs = raw_events(srv, {"model": name, "input": MSGS, "max_output_tokens": 3, "stream": True})
            assert evs[-1][0] == "response.incomplete", evs[-1]
        _()

        @check("function calls: a forced call, its output back, streamed arguments")
        def _():
            forced = {"type": "function", "name": "get_weather"}
            r = oc.responses.create(model=name, input=MSGS, tools=TOOLS, tool_choice=forced, max_output_tokens=64,
                                    temperature=0)
            calls = [o for o in r.output if o.type == "function_call"]
            assert len(calls) == 1 and calls[0].name == "get_weather", r.output
            args = json.loads(calls[0].arguments)
            assert isinstance(args.get("city"), str) and calls[0].call_id, calls[0]
            chat = oc.chat.completions.create(model=name, messages=MSGS, tools=CHAT_TOOLS, max_tokens=64, temperature=0,
                                              tool_choice={"type": "function", "function": {"name": "get_weather"}})
            assert chat.choices[0].message.tool_calls[0].function.arguments == calls[0].arguments
            with oc.responses.stream(model=name, input=MSGS, tools=TOOLS, tool_choice=forced, max_output_tokens=64,
                                     temperature=0) as s:
                streamed = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
                final = s.get_final_response()  # a forced call completes
            assert streamed == calls[0].arguments, (streamed, calls[0])
            assert [o.arguments for o in final.output if o.type == "function_call"] == [calls[0].arguments]
            back = MSGS + [{"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                            "arguments": calls[0].arguments},
                           {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Cold and windy."}]
            after = oc.responses.create(model=name, input=back, tools=TOOLS, tool_choice="none", max_output_tokens=16,
                                        temperature=0)
            assert [o.type for o in after.output] == ["message"], after.output
            chat_back = MSGS + [{"role": "assistant", "content": "", "tool_calls": [
                {"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
                {"role": "tool", "tool_call_id": calls[0].call_id, "content": "Cold and windy."}]
            c2 = oc.chat.completions.create(model=name, messages=chat_back, tools=CHAT_TOOLS, tool_choice="none",
                                            max_tokens=16, temperature=0)
            assert after.output_text == c2.choices[0].message.content, (after.output_text, c2)
        _()

        @check("text.format json_schema: JSON the schema accepts")
        def _():
            schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                       "deep": {"type": "boolean"}},
                      "required": ["name", "deep"], "additionalProperties": False}
            r = oc.responses.create(model=name, input=MSGS, max_output_tokens=200, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "sea", "schema": schema, "strict": True}})
            assert r.status == "completed", r
            jsonschema.validate(json.loads(r.output_text), schema)
            assert r.text.format.type == "json_schema", r.text
        _()

        @check("reasoning: the reasoning parser's text as a reasoning item, streamed as reasoning_text deltas")
        def _():
            chat = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=24, temperature=0,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": True}})
            reasoning = chat.choices[0].message.model_extra["reasoning_content"]
            r = oc.responses.create(model=name, input=MSGS, max_output_tokens=24, temperature=0,
                                    reasoning={"effort": "high"})
            assert reasoning and r.output[0].type == "reasoning", (r.output, chat)
            assert r.output[0].content[0].text == reasoning, (r.output[0], reasoning)
            evs = raw_events(srv, {"model": name, "input": MSGS, "max_output_tokens": 24, "temperature": 0,
                                   "stream": True, "reasoning": {"effort": "high"}})
            streamed = "".join(d["delta"] for n, d in evs if n == "response.reasoning_text.delta")
            assert streamed == reasoning, (streamed, reasoning)
            off = oc.responses.create(model=name, input=MSGS, max_output_tokens=24, temperature=0,
                                      reasoning={"effort": "none"})
            assert [o.type for o in off.output] == ["message"], off.output
        _()

        @check("previous_response_id: the stored conversation continues; store false and unknown ids are refused")
        def _():
            first = oc.responses.create(model=name, input="My name is Ada.", max_output_tokens=8, temperature=0)
            second = oc.responses.create(model=name, input="What is my name?", previous_response_id=first.id,
                                         max_output_tokens=8, temperature=0)
            assert second.previous_response_id == first.id, second
            spelled = oc.responses.create(model=name, max_output_tokens=8, temperature=0, input=[
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "What is my name?"}])
            assert second.output_text == spelled.output_text and second.usage.input_tokens == spelled.usage.input_tokens
            unstored = oc.responses.create(model=name, input="x", max_output_tokens=2, store=False)
            for rid in (unstored.id, "resp_no_such"):
                e = error_of(lambda: oc.responses.create(model=name, input="y", previous_response_id=rid, max_output_tokens=2))
                assert e.status_code == 400 and e.body["param"] == "previous_response_id", e.body
            # The store keeps the 4 most recent responses.
            for i in range(4):
                oc.responses.create(model=name, input=f"turn {i}", max_output_tokens=1)
            e = error_of(lambda: oc.responses.create(model=name, input="y", previous_response_id=first.id, max_output_tokens=2))
            assert e.status_code == 400, e
        _()

        @check("errors: OpenAI's shape naming the field; the server keeps serving")
        def _():
            ok = {"model": name, "input": "hi", "max_output_tokens": 2}
            bodies = [
                ({**ok, "bogus": 1}, "bogus"), ({k: v for k, v in ok.items() if k != "input"}, "input"),
                ({**ok, "input": 3}, "input"), ({**ok, "input": []}, "input"),
                ({**ok, "input": [{"type": "input_image", "image_url": "x"}]}, "input"),
                ({**ok, "input": [{"role": "robot", "content": "x"}]}, "role"),
                ({**ok, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "content"),
                ({**ok, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "call_id"),
                ({**ok, "input": [{"type": "function_call_output", "call_id": "c"}]}, "output"),
                ({**ok, "tools": [{"type": "web_search"}]}, "tools"), ({**ok, "tool_choice": "maybe"}, "tool_choice"),
                ({**ok, "text": {"format": {"type": "yaml"}}}, "text.format"),
                ({**ok, "text": {"format": {"type": "json_schema", "name": "s"}}}, "schema"),
                ({**ok, "max_output_tokens": 0}, "max_output_tokens"), ({**ok, "temperature": "hot"}, "temperature"),
                ({**ok, "reasoning": {"effort": "max"}}, "effort"), ({**ok, "reasoning": {"summary": "auto"}}, "summary"),
                ({**ok, "truncation": "auto"}, "truncation"), ({**ok, "stream": "yes"}, "stream"),
                ({**ok, "metadata": {"k": 1}}, "metadata"), ({**ok, "previous_response_id": 5}, "previous_response_id"),
            ]
            for body, param in bodies:
                r = requests.post(srv.url + "/v1/responses", json=body, timeout=30)
                assert r.status_code == 400, (body, r.status_code, r.text)
                err = r.json()["error"]
                assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
            r = requests.post(srv.url + "/v1/responses", data=b"{not json", timeout=30)
            assert r.status_code == 400 and "error" in r.json(), r.text
            assert oc.responses.create(model=name, input="still here", max_output_tokens=2).output_text
        _()
        assert srv.alive()
    finally:
        srv.stop()

    # The random fixture (tests/fixtures/qwen35_moe, its own template): the same answers as chat,
    # streamed or not, and a forced call's round trip.
    srv = Server(args.fathom, os.path.join(args.fixtures, "qwen35_moe"), "--tool-call-parser", "hermes",
                 "--enable-auto-tool-choice", "--reasoning-parser", "qwen3")
    try:
        @check("random fixture: text, streaming, a function call round trip, text.format and reasoning as chat gives them")
        def _():
            oc = srv.client()
            name = oc.models.list().data[0].id
            chat = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=12, temperature=0)
            r = oc.responses.create(model=name, input=MSGS, max_output_tokens=12, temperature=0)
            assert r.output_text == chat.choices[0].message.content, (r.output_text, chat)
            evs = raw_events(srv, {"model": name, "input": MSGS, "max_output_tokens": 12, "temperature": 0,
                                   "stream": True})
            assert "".join(d["delta"] for n, d in evs if n == "response.output_text.delta") == r.output_text
            # (Random weights write strings until the limit: the city is one of two.)
            tools = [{**TOOLS[0], "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                                                 "required": ["city"]}}]
            forced = {"type": "function", "name": "get_weather"}
            f = oc.responses.create(model=name, input=MSGS, tools=tools, tool_choice=forced, max_output_tokens=48,
                                    temperature=0)
            call = [o for o in f.output if o.type == "function_call"][0]
            assert json.loads(call.arguments)["city"] in ("Paris", "Oslo"), call
            back = MSGS + [{"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                           {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}]
            after = oc.responses.create(model=name, input=back, tools=tools, tool_choice="none", max_output_tokens=8,
                                        temperature=0)
            assert [o.type for o in after.output] == ["message"], after.output
            schema = {"type": "object", "properties": {"deep": {"type": "boolean"}, "sea": {"enum": ["north", "red"]}},
                      "required": ["deep", "sea"], "additionalProperties": False}
            j = oc.responses.create(model=name, input=MSGS, max_output_tokens=64, temperature=0,
                                    text={"format": {"type": "json_schema", "name": "s", "schema": schema}})
            jsonschema.validate(json.loads(j.output_text), schema)
            think = oc.chat.completions.create(model=name, messages=MSGS, max_tokens=12, temperature=0,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": True}})
            x = oc.responses.create(model=name, input=MSGS, max_output_tokens=12, temperature=0,
                                    reasoning={"effort": "high"})
            # The fixture's template does not open thinking: whatever chat splits off, the Response does
            # too (the real Qwen3.5 template's split: test_qwen35_template_snapshot.py).
            reasoning = think.choices[0].message.model_extra.get("reasoning_content")
            got = [o.content[0].text for o in x.output if o.type == "reasoning"]
            assert got == ([reasoning] if reasoning else []), (x, think)
            assert x.output_text == (think.choices[0].message.content or ""), (x, think)
        _()
    finally:
        srv.stop()

    srv = Server(args.fathom, MODEL, "--responses-store-size", "0")
    try:
        @check("--responses-store-size 0: previous_response_id is refused, saying so")
        def _():
            oc = srv.client()
            name = oc.models.list().data[0].id
            first = oc.responses.create(model=name, input="hi", max_output_tokens=2)
            e = error_of(lambda: oc.responses.create(model=name, input="x", previous_response_id=first.id))
            assert e.status_code == 400 and "--responses-store-size" in e.body["message"], e.body
        _()
    finally:
        srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
