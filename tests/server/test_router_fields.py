"""The request fields vLLM's router and the SGLang Model Gateway add to every body, each checked
for its effect on `fathom serve` of the embedded default model (--reasoning-parser qwen3):
continue_final_message (the last assistant message is continued, not closed), no_stop_trim (the
stop string stays in the output), separate_reasoning / include_reasoning / stream_reasoning (the
reasoning split off, dropped, or sent in one piece), return_hidden_states (true refused by name);
and vLLM's /tokenize, which vLLM's router asks for the prompt's token ids.

Run by ctest as: python3 test_router_fields.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import os
import sys

import requests
from tokenizers import Tokenizer

from server_util import Server, check, sse_events, summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "fathom-tiny-moe")
REASONING, CONTENT = "the sea is wide and deep", "It is blue."
RAW = REASONING + "</think>" + CONTENT


def post(srv, path, body):
    r = requests.post(srv.url + path, json=body, timeout=60)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def stream(srv, path, body):
    """The parsed SSE chunks of a streamed request ([DONE] must end it)."""
    with requests.post(srv.url + path, json={**body, "stream": True}, stream=True, timeout=60) as r:
        assert r.status_code == 200, (r.status_code, r.text)
        return [c for _, c in sse_events(r)]


def forced_reasoning_body(**extra):
    # Thinking on: the prompt ends inside <think>. A one-choice grammar fixes the output, so that
    # it holds a known reasoning, "</think>" (spelt in ordinary tokens) and a known answer.
    return {"model": "m", "messages": [{"role": "user", "content": "What colour is the sea?"}], "max_tokens": 64,
            "temperature": 0, "chat_template_kwargs": {"enable_thinking": True},
            "structured_outputs": {"choice": [RAW]}, **extra}


def deltas(chunks, key):
    return [c["choices"][0]["delta"].get(key) for c in chunks if c["choices"] and c["choices"][0]["delta"].get(key)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    srv = Server(args.fathom, MODEL, "--reasoning-parser", "qwen3", "--served-model-name", "m")
    try:
        msgs = [{"role": "user", "content": "Tell me about the sea."}, {"role": "assistant", "content": "The sea is"}]

        @check("continue_final_message: the prompt ends inside the assistant's message, the model continues it")
        def _():
            base = {"model": "m", "messages": msgs, "max_tokens": 16, "temperature": 0, "return_token_ids": True}
            cont = post(srv, "/v1/chat/completions", {**base, "continue_final_message": True})["choices"][0]
            closed = post(srv, "/v1/chat/completions", {**base, "add_generation_prompt": False})["choices"][0]
            fresh = post(srv, "/v1/chat/completions", base)["choices"][0]
            prompt = tok.decode(cont["prompt_token_ids"], skip_special_tokens=False)
            assert prompt.endswith("<|im_start|>assistant\nThe sea is"), repr(prompt[-60:])
            # Not continued: the message is closed (and with the generation prompt a new turn opens).
            assert tok.decode(closed["prompt_token_ids"], skip_special_tokens=False).endswith("The sea is<|im_end|>\n")
            assert tok.decode(fresh["prompt_token_ids"], skip_special_tokens=False).endswith("<|im_start|>assistant\n"
                                                                                            "<think>\n\n</think>\n\n")
            # The continuation is the model's greedy continuation of exactly that prompt.
            same = post(srv, "/v1/completions", {"model": "m", "prompt": cont["prompt_token_ids"], "max_tokens": 16,
                                                 "temperature": 0})["choices"][0]["text"]
            assert cont["message"]["content"] == same and same, (cont["message"], same)
            assert cont["message"]["content"] != fresh["message"]["content"], cont["message"]
            print(f"  continued: {cont['message']['content']!r}; fresh turn: {fresh['message']['content']!r}")
        _()

        @check("no_stop_trim: the stop string stays at the end of the output (completions and chat)")
        def _():
            for path, base, text_of in (
                    ("/v1/completions", {"model": "m", "prompt": "The sea is", "max_tokens": 24, "temperature": 0},
                     lambda ch: ch["text"]),
                    ("/v1/chat/completions", {"model": "m", "messages": msgs[:1], "max_tokens": 24, "temperature": 0},
                     lambda ch: ch["message"]["content"])):
                text = text_of(post(srv, path, base)["choices"][0])
                words = text.split()
                assert len(words) >= 3, repr(text)
                stop = words[2]
                at = text.find(stop)
                trimmed = post(srv, path, {**base, "stop": [stop]})["choices"][0]
                kept = post(srv, path, {**base, "stop": [stop], "no_stop_trim": True})["choices"][0]
                assert text_of(trimmed) == text[:at] and trimmed["finish_reason"] == "stop", (trimmed, text, stop)
                assert text_of(kept) == text[:at + len(stop)] and kept["finish_reason"] == "stop", (kept, text, stop)
                print(f"  {path} stop {stop!r}: trimmed {text_of(trimmed)!r}, kept {text_of(kept)!r}")
        _()

        @check("separate_reasoning / include_reasoning: split (default), left in content, or dropped")
        def _():
            m = post(srv, "/v1/chat/completions", forced_reasoning_body())["choices"][0]["message"]
            assert m.get("reasoning_content") == REASONING and m["content"] == CONTENT, m
            m = post(srv, "/v1/chat/completions", forced_reasoning_body(separate_reasoning=False))["choices"][0]["message"]
            assert m["content"] == RAW and not m.get("reasoning_content"), m
            m = post(srv, "/v1/chat/completions", forced_reasoning_body(include_reasoning=False))["choices"][0]["message"]
            assert m["content"] == CONTENT and not m.get("reasoning_content"), m
        _()

        @check("streaming: stream_reasoning false sends the reasoning in one delta; the other switches as above")
        def _():
            on = stream(srv, "/v1/chat/completions", forced_reasoning_body())
            assert "".join(deltas(on, "reasoning_content")) == REASONING and len(deltas(on, "reasoning_content")) >= 2, on
            assert "".join(deltas(on, "content")) == CONTENT
            held = stream(srv, "/v1/chat/completions", forced_reasoning_body(stream_reasoning=False))
            assert deltas(held, "reasoning_content") == [REASONING], deltas(held, "reasoning_content")
            assert "".join(deltas(held, "content")) == CONTENT
            raw = stream(srv, "/v1/chat/completions", forced_reasoning_body(separate_reasoning=False))
            assert not deltas(raw, "reasoning_content") and "".join(deltas(raw, "content")) == RAW
            dropped = stream(srv, "/v1/chat/completions", forced_reasoning_body(include_reasoning=False))
            assert not deltas(dropped, "reasoning_content") and "".join(deltas(dropped, "content")) == CONTENT
            print(f"  reasoning deltas streamed: {len(deltas(on, 'reasoning_content'))}, held: 1")
        _()

        @check("/tokenize (vLLM's, which vLLM's router asks): the ids a chat or completion request's prompt has")
        def _():
            chat = post(srv, "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 1,
                                                      "continue_final_message": True, "return_token_ids": True})
            want = chat["choices"][0]["prompt_token_ids"]
            got = post(srv, "/tokenize", {"model": "m", "messages": msgs, "continue_final_message": True,
                                          "add_generation_prompt": False})
            assert got["tokens"] == want and got["count"] == len(want) and got["max_model_len"] > 0, (got, want)
            got = post(srv, "/tokenize", {"model": "m", "prompt": "The sea is wide.", "return_token_strs": True})
            assert got["tokens"] == tok.encode("The sea is wide.").ids, got
            assert "".join(got["token_strs"]) == "The sea is wide.", got
            r = requests.post(srv.url + "/tokenize", json={"prompt": "x", "echo": True}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text
        _()

        @check("return_hidden_states: false accepted, true refused by name; unknown fields still 400")
        def _():
            ok = requests.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1,
                                                                  "return_hidden_states": False}, timeout=30)
            assert ok.status_code == 200, ok.text
            r = requests.post(srv.url + "/v1/completions", json={"prompt": "x", "return_hidden_states": True}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "return_hidden_states", r.text
            r = requests.post(srv.url + "/v1/chat/completions", json={"messages": msgs[:1], "no_such_field": 1}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_parameter", r.text
        _()
    finally:
        srv.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
