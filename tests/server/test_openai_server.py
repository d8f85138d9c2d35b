#!/usr/bin/env python3
"""End-to-end tests of `fathom serve` with the official `openai` client (CPU backend, tiny fixture).

Run by ctest as: python3 test_openai_server.py --fathom BIN --fixtures FIXTURES_DIR
The fixture model (tests/fixtures/qwen35_moe) has the tiny tokenizer written by
tools/make_tiny_tokenizer.py (tokenizer.json, tokenizer_config.json with Qwen3's chat template).
The real Qwen3.5 chat template (not in the repository) is tested by test_qwen35_template_snapshot.py.
"""
import argparse
import concurrent.futures as cf
import json
import os
import socket
import sys
import time

import openai
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import Server, check, summary  # noqa: E402


def deep(levels):
    """A JSON value nested `levels` objects deep."""
    v = {"type": "string"}
    for _ in range(levels):
        v = {"type": "object", "properties": {"x": v}}
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    model = os.path.join(args.fixtures, "qwen35_moe")
    if not os.path.exists(os.path.join(model, "tokenizer.json")):
        print(f"FAIL: {model}/tokenizer.json missing (run tools/make_tiny_tokenizer.py {model})")
        print("0 passed, 1 failed")
        return 1
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    vocab = json.load(open(os.path.join(model, "config.json")))
    srv = Server(args.fathom, model, "--reasoning-parser", "qwen3", "--max-num-seqs", "64", "--enable-fault-injection")
    name = model
    try:
        cl = srv.client()

        @check("models")
        def _():
            ids = [m.id for m in cl.models.list().data]
            assert ids == [name], ids
        _()

        @check("completion text + usage")
        def _():
            prompt = "Once upon a time, there was a little girl"
            r = cl.completions.create(model=name, prompt=prompt, max_tokens=7, temperature=0)
            assert r.object == "text_completion"
            assert r.usage.prompt_tokens == len(hf.encode(prompt).ids), (r.usage, len(hf.encode(prompt).ids))
            assert r.usage.completion_tokens == 7 and r.usage.total_tokens == r.usage.prompt_tokens + 7
            assert r.choices[0].finish_reason == "length"
            assert isinstance(r.choices[0].text, str) and r.choices[0].text
        _()

        @check("usage.prompt_tokens_details.cached_tokens: an exact repeat is served whole from the prefix cache")
        def _():
            prompt = "A prompt sent twice, word for word, to see its cached tokens"
            first = cl.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0)
            again = cl.completions.create(model=name, prompt=prompt, max_tokens=4, temperature=0)
            assert first.usage.prompt_tokens_details.cached_tokens == 0, first.usage
            assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens, again.usage
            assert again.choices[0].text == first.choices[0].text
        _()

        @check("completion streaming equals non-streaming")
        def _():
            prompt = "The quick brown fox"
            full = cl.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0).choices[0].text
            parts, usage, finish = [], None, None
            for ch in cl.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
                if ch.usage:
                    usage = ch.usage
                for c in ch.choices:
                    parts.append(c.text)
                    finish = c.finish_reason or finish
            assert "".join(parts) == full, ("".join(parts), full)
            assert usage and usage.completion_tokens == 12 and usage.prompt_tokens == len(hf.encode(prompt).ids)
            assert finish == "length"
        _()

        @check("token-id prompts, list of prompts, return_token_ids")
        def _():
            r = cl.completions.create(model=name, prompt=[[5, 6, 7, 8], [9, 10, 11]], max_tokens=3, temperature=0,
                                      extra_body={"return_token_ids": True})
            assert len(r.choices) == 2 and r.usage.prompt_tokens == 7 and r.usage.completion_tokens == 6
            for c in r.choices:
                toks = c.model_extra["token_ids"]
                assert len(toks) == 3 and hf.decode(toks, skip_special_tokens=True) == c.text
        _()

        @check("chat (Qwen3 template) + reasoning parser + usage")
        def _():
            msgs = [{"role": "user", "content": "What is the capital of France?"}]
            r = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0)
            m = r.choices[0].message
            assert r.usage.completion_tokens == 8
            # Qwen3's template leaves the thinking to the model; this one never writes <think>.
            assert m.content and not m.model_extra.get("reasoning_content"), m
            tmpl_prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
            assert r.usage.prompt_tokens == len(hf.encode(tmpl_prompt, add_special_tokens=False).ids)
            r2 = cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            assert r2.choices[0].message.content and not r2.choices[0].message.model_extra.get("reasoning_content")
            assert r2.usage.prompt_tokens == len(hf.encode(tmpl_prompt + "<think>\n\n</think>\n\n",
                                                           add_special_tokens=False).ids)
            cs = ""
            for ch in cl.chat.completions.create(model=name, messages=msgs, max_tokens=8, temperature=0, stream=True):
                for c in ch.choices:
                    assert not (c.delta.model_extra or {}).get("reasoning_content")
                    cs += c.delta.content or ""
            assert cs == m.content, (cs, m.content)
        _()

        @check("stop strings (incl. split across tokens)")
        def _():
            prompt = [5, 6, 7, 8, 9]
            full = cl.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
            assert len(full) >= 6, full
            stop = full[3:6]  # likely spans a token boundary
            r = cl.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
            c = r.choices[0]
            assert c.text == full[:full.index(stop)], (c.text, full, stop)
            assert c.finish_reason == "stop" and c.model_extra.get("stop_reason") == stop
            parts = []
            for ch in cl.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0, stop=[stop], stream=True):
                parts += [x.text for x in ch.choices]
            assert "".join(parts) == c.text
        _()

        @check("n > 1 and seed reproducibility")
        def _():
            kw = dict(model=name, prompt="Hello", max_tokens=10, temperature=1.0, seed=1234, n=3)
            a = cl.completions.create(**kw)
            b = cl.completions.create(**kw)
            assert len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2]
            assert [c.text for c in a.choices] == [c.text for c in b.choices]
            assert len({c.text for c in a.choices}) > 1, [c.text for c in a.choices]
            assert a.usage.completion_tokens == 30
            # Another seed, another sample (fixed seeds: the outcome is the same on every run).
            c2 = cl.completions.create(**{**kw, "seed": 99, "n": 1})
            assert c2.choices[0].text != a.choices[0].text, (c2.choices[0].text, a.choices[0].text)
        _()

        @check("logprobs (completions and chat)")
        def _():
            r = cl.completions.create(model=name, prompt="Hello", max_tokens=4, temperature=0, logprobs=3)
            lp = r.choices[0].logprobs
            assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and all(len(t) == 3 for t in lp.top_logprobs)
            assert all(v <= 0 for v in lp.token_logprobs)
            assert abs(max(lp.top_logprobs[0].values()) - lp.token_logprobs[0]) < 1e-5  # greedy = top-1
            r = cl.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                           temperature=0, logprobs=True, top_logprobs=2)
            c = r.choices[0].logprobs.content
            assert len(c) == 3 and all(len(x.top_logprobs) == 2 for x in c)
        _()

        @check("penalties and sampling knobs accepted")
        def _():
            r = cl.completions.create(model=name, prompt="Hello", max_tokens=5, temperature=0.8, top_p=0.9,
                                      presence_penalty=1.0, frequency_penalty=0.5,
                                      extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2})
            assert r.usage.completion_tokens == 5
            g = cl.completions.create(model=name, prompt=[5, 6, 7], max_tokens=16, temperature=0,
                                      extra_body={"repetition_penalty": 5.0}).choices[0]
            assert g.finish_reason == "length"
        _()

        @check("batching is invisible (64 concurrent == alone, greedy)")
        def _():
            import random
            rng = random.Random(7)
            prompts = [[rng.randrange(2, 500) for _ in range(rng.randrange(3, 40))] for _ in range(64)]

            def run(p):
                r = cl.completions.create(model=name, prompt=p, max_tokens=8, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
                return r.choices[0].model_extra["token_ids"]
            alone = [run(p) for p in prompts[:16]]
            with cf.ThreadPoolExecutor(64) as ex:
                together = list(ex.map(run, prompts))
            assert together[:16] == alone, [i for i in range(16) if together[i] != alone[i]]
            alone2 = [run(p) for p in prompts[16:]]
            assert together[16:] == alone2, [i + 16 for i in range(48) if together[16 + i] != alone2[i]]
        _()

        @check("cancellation frees the slot")
        def _():
            s = requests.post(srv.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3000, "stream": True,
                                                                  "ignore_eos": True}, stream=True, timeout=30)
            it = s.iter_lines()
            got = 0
            for line in it:
                if line.startswith(b"data: "):
                    got += 1
                    if got >= 3:
                        break
            assert srv.metric("fathom:num_requests_running") == 1
            s.close()
            deadline = time.time() + 10
            while time.time() < deadline and srv.metric("fathom:num_requests_running") != 0:
                time.sleep(0.05)
            assert srv.metric("fathom:num_requests_running") == 0
            assert srv.metric('fathom:request_success_total{model_name="%s",finished_reason="abort"}' % name) >= 1
        _()

        @check("malformed requests get OpenAI errors")
        def _():
            big = [5] * 5000
            cases = [
                ("POST", "/v1/completions", "{not json", 400),
                ("POST", "/v1/completions", "[1,2,3]", 400),
                ("POST", "/v1/completions", "", 400),
                ("POST", "/v1/completions", {}, 400),
                ("POST", "/v1/completions", {"prompt": 5}, 400),
                ("POST", "/v1/completions", {"prompt": []}, 400),
                ("POST", "/v1/completions", {"prompt": [1, "a"]}, 400),
                ("POST", "/v1/completions", {"prompt": [[1, 2], 3]}, 400),
                ("POST", "/v1/completions", {"prompt": [1, 99999]}, 400),
                ("POST", "/v1/completions", {"prompt": [1, -3]}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "top_p": 0}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "n": 0}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stop": 7}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stop": [""]}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "logprobs": 50}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "presence_penalty": 5}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "model": "no-such-model"}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "seed": "abc"}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stream": "yes"}, 400),
                ("POST", "/v1/completions", {"prompt": big}, 400, "4096 tokens. However, your prompt has 5000 tokens"),
                ("POST", "/v1/completions", {"prompt": [5, 6], "max_tokens": 5000}, 400),
                ("POST", "/v1/chat/completions", {}, 400),
                ("POST", "/v1/chat/completions", {"messages": []}, 400),
                ("POST", "/v1/chat/completions", {"messages": "hello"}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
                ("GET", "/v1/nothing", None, 404),
                ("POST", "/v2/completions", {"prompt": "hi"}, 404),
                ("POST", "/health", None, 405),
                # Hostile nesting: refused while parsing, before anything walks the tree.
                ("POST", "/v1/chat/completions", '{"messages": ' + "[" * 100000 + "]" * 100000 + "}", 400, "64 levels"),
                ("POST", "/v1/completions", '{"prompt": ' + "[" * 70 + "1" + "]" * 70 + "}", 400, "64 levels"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                  "tools": [{"type": "function", "function": {"name": "f", "parameters": deep(80)}}]},
                 400, "64 levels"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": json.dumps(deep(80))}}]}]},
                 400, "64 levels"),
                # Numbers, types, encodings.
                ("POST", "/v1/completions", '{"prompt": "hi", "max_tokens": 1e400}', 400),
                ("POST", "/v1/completions", '{"prompt": "hi", "max_tokens": 99999999999999999999999}', 400),
                ("POST", "/v1/completions", '{"prompt": [1, 184467440737095516150]}', 400),
                ("POST", "/v1/completions", '{"prompt": "hi", "temperature": 1e309}', 400),
                ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": True}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "n": 1.5}, 400),
                ("POST", "/v1/completions", b'{"prompt": "\xff\xfe bad utf-8"}', 400),
                ("POST", "/v1/completions", '{"prompt": "hi", "prompt": 5}', 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stop_token_ids": ["a"]}, 400),
                ("POST", "/v1/completions", {"prompt": "hi", "stream": True, "stream_options": 5}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": 5}]}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": "x"}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [5]}, 400),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": 7}]}, 400),
                # logit_bias as OpenAI: token ids of the vocabulary, values in [-100, 100].
                ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": []}, 400, "logit_bias"),
                ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "abc"),
                ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"99999": 1}}, 400, "99999"),
                ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "[-100, 100]"),
                ("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"5": "x"}}, 400, "logit_bias"),
                # Fields we do not implement are named, never silently ignored.
                ("POST", "/v1/completions", {"prompt": "hi", "best_of": 3}, 400, "best_of"),
                ("POST", "/v1/completions", {"prompt": "hi", "prompt_logprobs": 1}, 400, "prompt_logprobs"),
                ("POST", "/v1/completions", {"prompt": "hi", "frobnicate": 1, "guided_whitespace_pattern": " "}, 400,
                 "'frobnicate', 'guided_whitespace_pattern'"),
                ("POST", "/v1/completions", {"prompt": "hi", "suffix": " end"}, 400, "suffix"),
                ("POST", "/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 2}, 400, "echo"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                  "response_format": {"type": "yaml"}}, 400, "response_format"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
                 400, "tool_choice"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": False},
                 400, "parallel_tool_calls"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, 400, "echo"),
                ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, 400, "prompt"),
                ("POST", "/v1/completions", {"prompt": "hi", "fathom_fault": {"site": "nowhere"}}, 400, "fathom_fault"),
            ]
            bad = []
            for method, path, body, status, *needle in cases:
                data = body if isinstance(body, (str, bytes)) else (json.dumps(body) if body is not None else None)
                r = requests.request(method, srv.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30)
                ok = r.status_code == status
                try:
                    e = r.json()["error"]
                    ok = ok and isinstance(e["message"], str) and isinstance(e["type"], str) and "param" in e and "code" in e
                    ok = ok and (not needle or needle[0] in e["message"])
                except Exception:  # noqa: BLE001
                    ok = False
                if not ok:
                    shown = body if not isinstance(body, (dict, str, bytes)) or len(str(body)) < 300 else str(body)[:80] + "..."
                    bad.append((path, shown, r.status_code, r.text[:200]))
                assert srv.alive(), f"the server died on {str(body)[:100]}"
            assert not bad, bad
            assert len(cases) >= 30
            # Still alive and serving.
            r = cl.completions.create(model=name, prompt="Hello", max_tokens=2, temperature=0)
            assert r.usage.completion_tokens == 2
            assert requests.get(srv.url + "/health", timeout=5).status_code == 200
        _()

        @check("logit_bias: +100 makes greedy output that token, -100 bans it")
        def _():
            base = dict(model=name, prompt=[5, 6, 7], max_tokens=6, temperature=0,
                        extra_body={"return_token_ids": True, "ignore_eos": True})
            plain = cl.completions.create(**base).choices[0].model_extra["token_ids"]
            forced = cl.completions.create(**{**base, "logit_bias": {"42": 100}}).choices[0].model_extra["token_ids"]
            assert forced == [42] * 6, forced
            banned = cl.completions.create(**{**base, "logit_bias": {str(t): -100 for t in set(plain)}})
            got = banned.choices[0].model_extra["token_ids"]
            assert not set(got) & set(plain), (got, plain)
        _()

        @check("echo: the prompt's text leads the completion (streaming too)")
        def _():
            prompt = "Once upon a time"
            plain = cl.completions.create(model=name, prompt=prompt, max_tokens=5, temperature=0).choices[0].text
            echoed = cl.completions.create(model=name, prompt=prompt, max_tokens=5, temperature=0, echo=True).choices[0].text
            assert echoed == prompt + plain, (echoed, plain)
            parts = []
            for ch in cl.completions.create(model=name, prompt=prompt, max_tokens=5, temperature=0, echo=True, stream=True):
                parts += [c.text for c in ch.choices]
            assert "".join(parts) == echoed, parts
        _()

        @check("a non-streaming request is aborted within 100 ms of its client disconnecting")
        def _():
            # Start from an idle server: the gauge can trail the previous check's last response
            # by a step on a loaded machine (seen once with two test processes on two cores).
            deadline = time.time() + 5
            while srv.metric("fathom:num_requests_running") != 0:
                assert time.time() < deadline, "an earlier request is still running"
                time.sleep(0.01)
            body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 3000, "ignore_eos": True}).encode()
            sock = socket.create_connection(("127.0.0.1", srv.port))
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.time() + 30
            while srv.metric("fathom:num_requests_running") != 1 or srv.metric("fathom:generation_tokens_total") == 0:
                assert time.time() < deadline, "the request never started"
                time.sleep(0.01)
            tokens_before = srv.metric("fathom:generation_tokens_total")
            time.sleep(0.2)
            assert srv.metric("fathom:generation_tokens_total") > tokens_before, "not generating"
            aborts = srv.metric('fathom:request_success_total{model_name="%s",finished_reason="abort"}' % name)
            sock.close()
            t0 = time.perf_counter()
            while srv.metric("fathom:num_requests_running") != 0 and time.perf_counter() - t0 < 5:
                time.sleep(0.002)
            elapsed = time.perf_counter() - t0
            assert srv.metric("fathom:num_requests_running") == 0, "still running 5 s after the disconnect"
            print(f"  aborted {elapsed * 1000:.1f} ms after the disconnect")
            assert elapsed < 0.1, f"aborted {elapsed * 1000:.0f} ms after the disconnect"
            assert srv.metric("fathom:kv_cache_usage_perc") == 0, "its KV blocks were not freed"
            assert srv.metric('fathom:request_success_total{model_name="%s",finished_reason="abort"}' % name) == aborts + 1
        _()

        @check("an error in one request of a batch of 8 ends that request alone (every fault site)")
        def _():
            import random
            rng = random.Random(3)
            prompts = [[rng.randrange(2, 500) for _ in range(rng.randrange(3, 20))] for _ in range(8)]
            params = {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True, "stop": ["zzqx"]}

            def run(p, fault=None, stream=False):
                body = {"prompt": p, **params, **({"fathom_fault": fault} if fault else {}), "stream": stream}
                r = requests.post(srv.url + "/v1/completions", json=body, timeout=60, stream=stream)
                if not stream:
                    return r.status_code, r.json()
                events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: {")]
                return r.status_code, events
            want = [run(p)[1]["choices"][0]["token_ids"] for p in prompts]
            for site in ["sample", "detokenize", "stop", "forward"]:
                errors_before = srv.metric('fathom:request_errors_total{model_name="%s",stage="%s"}' % (name, site))
                faulty = rng.randrange(8)
                with cf.ThreadPoolExecutor(8) as ex:
                    futs = [ex.submit(run, p, {"site": site, "after_tokens": 2} if i == faulty else None)
                            for i, p in enumerate(prompts)]
                    res = [f.result() for f in futs]
                for i, (code, j) in enumerate(res):
                    if i == faulty:
                        assert code == 500 and site in j["error"]["message"], (site, code, j)
                    else:
                        assert code == 200 and j["choices"][0]["token_ids"] == want[i], (site, i, code, j)
                after = srv.metric('fathom:request_errors_total{model_name="%s",stage="%s"}' % (name, site))
                assert after == errors_before + 1, (site, errors_before, after)
            # Streaming: the faulty request gets an SSE error event, then [DONE].
            code, events = run(prompts[0], {"site": "detokenize", "after_tokens": 3}, stream=True)
            assert code == 200 and "error" in events[-1] and "detokenize" in events[-1]["error"]["message"], events[-2:]
            assert run(prompts[0])[1]["choices"][0]["token_ids"] == want[0]
            # The response can reach the client before the engine's step that frees the sequence
            # (seen on a loaded 2-core CI machine): the gauge must return to 0, within a second.
            deadline = time.time() + 1.0
            while srv.metric("fathom:num_requests_running") != 0 and time.time() < deadline:
                time.sleep(0.01)
            assert srv.metric("fathom:num_requests_running") == 0
        _()

        @check("metrics")
        def _():
            text = requests.get(srv.url + "/metrics", timeout=5).text
            for m in ["fathom:num_requests_running", "fathom:num_requests_waiting", "fathom:kv_cache_usage_perc",
                      "fathom:prompt_tokens_total", "fathom:generation_tokens_total", "fathom:request_success_total",
                      "fathom:time_to_first_token_seconds_bucket", "fathom:inter_token_latency_seconds_bucket",
                      "fathom:prefix_cache_queries_total", "fathom:prefix_cache_hits_total"]:
                assert m in text, m
            assert srv.metric("fathom:generation_tokens_total") > 100
            assert srv.metric("fathom:prefix_cache_queries_total") >= srv.metric("fathom:prefix_cache_hits_total") >= 0
        _()
    finally:
        srv.stop()

    # A tiny server: one running sequence and one queued, the rest must get 429; plus an API key.
    small = Server(args.fathom, model, "--max-num-seqs", "1", "--max-queue-len", "1", "--api-key", "sekret",
                   "--no-enable-prefix-caching")
    try:
        @check("prefix caching off")
        def _():
            assert "prefix_cache_queries_total" not in requests.get(small.url + "/metrics", timeout=5).text
        _()

        @check("API key enforced")
        def _():
            r = requests.get(small.url + "/v1/models", timeout=5)
            assert r.status_code == 401 and r.json()["error"]["type"]
            r = requests.get(small.url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=5)
            assert r.status_code == 401
            try:
                small.client("wrong").models.list()
                raise AssertionError("no error")
            except openai.AuthenticationError:
                pass
            assert small.client("sekret").models.list().data[0].id == name
        _()

        @check("429 when the queue is full, then recovers")
        def _():
            def one(_):
                r = requests.post(small.url + "/v1/completions", headers={"Authorization": "Bearer sekret"},
                                  json={"prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True}, timeout=60)
                return r.status_code, r.json()
            with cf.ThreadPoolExecutor(12) as ex:
                res = list(ex.map(one, range(12)))
            codes = [c for c, _ in res]
            assert 429 in codes and 200 in codes, codes
            assert all(set(j["error"]) >= {"message", "type", "param", "code"} for c, j in res if c == 429)
            r = small.client("sekret").completions.create(model=name, prompt=[5, 6], max_tokens=2)
            assert r.usage.completion_tokens == 2
        _()
    finally:
        small.stop()

    # KV blocks for far fewer tokens than the running sequences need: the scheduler must preempt
    # (drop a sequence's state and recompute it later) without changing any greedy output.
    tight = Server(args.fathom, model, "--max-num-seqs", "8", "--max-model-len", "64", "--num-kv-blocks", "12")
    try:
        @check("preemption by recompute keeps greedy outputs")
        def _():
            import random
            rng = random.Random(11)
            prompts = [[rng.randrange(2, 500) for _ in range(30)] for _ in range(8)]
            cl = tight.client()
            body = {"return_token_ids": True, "ignore_eos": True}
            alone = [cl.completions.create(model=name, prompt=p, max_tokens=24, temperature=0, extra_body=body)
                     .choices[0].model_extra["token_ids"] for p in prompts]
            assert tight.metric("fathom:num_preemptions_total") == 0
            # One request with all 8 prompts: they reach the engine in one submission, so 8 x 54
            # tokens meet a pool of 12 blocks (192 tokens) whatever the timing: preemption is certain.
            r = cl.completions.create(model=name, prompt=prompts, max_tokens=24, temperature=0, extra_body=body)
            together = [c.model_extra["token_ids"] for c in sorted(r.choices, key=lambda c: c.index)]
            assert tight.metric("fathom:num_preemptions_total") > 0, "the test did not cause a preemption"
            assert together == alone, [i for i in range(8) if together[i] != alone[i]]
        _()
    finally:
        tight.stop()

    # Speculative decoding (MTP drafts, fixed K so every round drafts) inside continuous batching:
    # concurrent greedy requests, streamed or not, equal the plain server's; /metrics reports the
    # drafts and acceptance.
    plain = Server(args.fathom, model, "--max-num-seqs", "8")
    spec = Server(args.fathom, model, "--max-num-seqs", "8", "--speculative-algorithm", "nextn",
                  "--speculative-num-steps", "2", "--no-speculative-adaptive")
    try:
        @check("speculative decoding (nextn) equals plain decoding, with acceptance in /metrics")
        def _():
            import random
            rng = random.Random(5)
            prompts = [[rng.randrange(2, 500) for _ in range(n)] for n in (3, 11, 29, 40, 7, 18)]

            def run(server, p, stream):
                cl = server.client()
                body = {"return_token_ids": True, "ignore_eos": True}
                if not stream:
                    r = cl.completions.create(model=name, prompt=p, max_tokens=20, temperature=0, extra_body=body)
                    return r.choices[0].model_extra["token_ids"]
                ids = []
                for ch in cl.completions.create(model=name, prompt=p, max_tokens=20, temperature=0, stream=True,
                                                extra_body=body):
                    for c in ch.choices:
                        ids += c.model_extra.get("token_ids") or []
                return ids
            want = [run(plain, p, False) for p in prompts]
            with cf.ThreadPoolExecutor(6) as ex:
                got = list(ex.map(lambda ip: run(spec, ip[1], ip[0] % 2 == 1), enumerate(prompts)))
            assert got == want, [i for i in range(len(prompts)) if got[i] != want[i]]
            drafts = spec.metric("fathom:spec_decode_num_draft_tokens_total")
            rounds = spec.metric("fathom:spec_decode_num_drafts_total")
            accepted = spec.metric("fathom:spec_decode_num_accepted_tokens_total")
            length = spec.metric("fathom:spec_decode_mean_accepted_length")
            assert drafts > 0 and rounds > 0 and 0 <= accepted <= drafts, (drafts, rounds, accepted)
            assert abs(length - (accepted + rounds) / rounds) < 1e-9, length
            text = requests.get(spec.url + "/metrics", timeout=5).text
            assert 'fathom:spec_decode_acceptance_rate_per_pos{model_name="' in text and 'position="1"' in text
            assert "spec_decode" not in requests.get(plain.url + "/metrics", timeout=5).text
        _()
    finally:
        plain.stop()
        spec.stop()

    return summary()


if __name__ == "__main__":
    sys.exit(main())
