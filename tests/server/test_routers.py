"""Two `fathom serve` replicas of the embedded default model behind the routers people run in front
of vLLM and SGLang, both from PyPI (scripts/requirements-test.txt): vLLM's router (`vllm-router`)
and the SGLang Model Gateway (`sglang-router launch`), each with --policy cache_aware. Through each
router: chat completions, streamed completions, tool calls, structured output; 8 requests sharing
a long prompt land on one replica (its prefix-cache hits grow, the other's stay); one replica
killed, the router answers every request from the other once its health check has noticed;
SIGTERM on the last replica while a request streams through the router, and that request
completes (the server drains before it exits); and --shutdown-timeout bounds that drain.

Run by ctest as: python3 test_routers.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import requests

from server_util import Server, check, free_port, sse_events, stop_process, summary, wait_until_up

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "fathom-tiny-moe")
BIN = os.path.dirname(os.path.abspath(sys.executable))  # the venv's scripts, where pip put the routers
HEALTH_INTERVAL_S = 1
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# A long shared prompt: well past the prefix cache's minimum shared length (256 tokens).
OTHER = " ".join(f"Lighthouse keeper {i} writes in the log about storms, gulls and passing ships." for i in range(60))
SHARED = " ".join(f"The harbour wall number {i} faces the grey northern sea and the fishing boats." for i in range(60))


def router_bin(name):
    """The router's script: beside this Python (the test venv, where pip put it), else on PATH."""
    here = os.path.join(BIN, name)
    return here if os.path.exists(here) else (shutil.which(name) or here)


def router_command(kind, port, workers):
    common = ["--worker-urls", *workers, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port),
              "--prometheus-port", str(free_port()), "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
              "--health-failure-threshold", "1", "--log-level", "warn" if kind == "sglang" else "warning"]
    if kind == "vllm":
        return [router_bin("vllm-router"), *common]
    return [router_bin("sglang-router"), "launch", *common]


class Router:
    def __init__(self, kind, workers):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = router_command(kind, self.port, workers)
        if not os.path.exists(cmd[0]):
            raise RuntimeError(f"{cmd[0]} is not installed (scripts/requirements-test.txt)")
        self.log = open(os.devnull, "w") if not os.environ.get("FATHOM_TEST_VERBOSE") else None
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until_up(self.proc, self.url + "/v1/models", f"{kind} router", interval_s=0.2)

    def post(self, path, body, timeout=60):
        r = requests.post(self.url + path, json=body, timeout=timeout)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
        return r.json()

    def stop(self):
        stop_process(self.proc)


def check_api(router, label):
    @check(f"{label}: /v1/models names the replicas' served model")
    def _():
        # The SGLang gateway learns it from the replicas' /model_info (else it lists "unknown").
        ids = [m["id"] for m in requests.get(router.url + "/v1/models", timeout=10).json()["data"]]
        assert ids == ["m"], ids
    _()

    @check(f"{label}: chat completion")
    def _():
        r = router.post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Tell me about the sea."}],
                                                 "max_tokens": 24, "temperature": 0})
        c = r["choices"][0]
        assert c["message"]["content"] and c["finish_reason"] in ("stop", "length"), c
    _()

    @check(f"{label}: streamed completion and chat completion")
    def _():
        body = {"model": "m", "prompt": "The sea is", "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": True}
        with requests.post(router.url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
            assert resp.status_code == 200, resp.text
            chunks = [c for _, c in sse_events(resp)]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        whole = router.post("/v1/completions", {**body, "stream": False})["choices"][0]["text"]
        assert len(chunks) >= 2 and text == whole and text, (len(chunks), text, whole)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length", chunks[-1]
        chat = {"model": "m", "messages": [{"role": "user", "content": "Tell me about the sea."}], "max_tokens": 16,
                "temperature": 0}
        with requests.post(router.url + "/v1/chat/completions", json={**chat, "stream": True}, stream=True, timeout=60) as resp:
            assert resp.status_code == 200, resp.text
            streamed = "".join(c["choices"][0]["delta"].get("content") or "" for _, c in sse_events(resp) if c["choices"])
        assert streamed and streamed == router.post("/v1/chat/completions", chat)["choices"][0]["message"]["content"]
    _()

    @check(f"{label}: tool calls")
    def _():
        r = router.post("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64,
            "temperature": 0})
        c = r["choices"][0]
        calls = c["message"].get("tool_calls") or []
        assert calls and calls[0]["function"]["name"] == "get_weather", c
        assert isinstance(json.loads(calls[0]["function"]["arguments"]).get("city"), str), calls
        assert c["finish_reason"] == "tool_calls", c
    _()

    @check(f"{label}: structured output")
    def _():
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                   "waves": {"type": "boolean"}}, "required": ["name", "waves"],
                  "additionalProperties": False}
        r = router.post("/v1/chat/completions", {
            "model": "m", "messages": [{"role": "user", "content": "Describe the sea as JSON."}], "max_tokens": 64,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "sea", "schema": schema}}})
        obj = json.loads(r["choices"][0]["message"]["content"])
        assert set(obj) == {"name", "waves"} and isinstance(obj["waves"], bool), obj
    _()


def counts(replicas):
    return [(s.metric("fathom:requests_received_total"), s.metric("fathom:prefix_cache_hits_total")) for s in replicas]


def send_shared(router, replicas, prefix, n=8):
    """n requests sharing `prefix`, one after another: the requests and prefix-cache hit tokens
    each replica got."""
    before = counts(replicas)
    for i in range(n):
        router.post("/v1/completions", {"model": "m", "prompt": prefix + f" Question {i}: which one?", "max_tokens": 4,
                                        "temperature": 0})
    after = counts(replicas)
    return [a[0] - b[0] for a, b in zip(after, before)], [a[1] - b[1] for a, b in zip(after, before)]


def check_prefix_routing(router, label, replicas):
    busy = []

    @check(f"{label}: 8 requests sharing a long prompt land on one replica, whose prefix-cache hits grow")
    def _():
        got, hits = send_shared(router, replicas, SHARED)
        print(f"  requests per replica {got}, prefix-cache hit tokens per replica {hits}")
        assert sorted(got) == [0, 8], got
        busy.append(got.index(8))
        assert hits[busy[0]] > 0 and hits[1 - busy[0]] == 0, hits
    _()

    @check(f"{label}: with that replica loaded, a new prompt goes to the other, and the first prompt still to it")
    def _():
        # A prompt no replica has seen goes to the least loaded one (all tie when idle); one that
        # shares a replica's prefix follows it. A long request sharing the first prompt keeps its
        # replica loaded meanwhile (vLLM's router learns the prompts' tokens from /tokenize).
        x = busy[0]
        long_one = threading.Thread(target=router.post, args=("/v1/completions", {
            "model": "m", "prompt": SHARED + " Tell a long story.", "max_tokens": 1200, "ignore_eos": True}, 120))
        long_one.start()
        deadline = time.time() + 30
        while replicas[x].metric("fathom:num_requests_running") < 1 and time.time() < deadline:
            time.sleep(0.05)
        got_other, _ = send_shared(router, replicas, OTHER, 4)
        got_first, _ = send_shared(router, replicas, SHARED, 4)
        still_running = replicas[x].metric("fathom:num_requests_running")
        long_one.join()
        print(f"  while one replica runs a long request: a new prompt went {got_other}, the first prompt {got_first}")
        assert still_running >= 1, "the long request ended too soon to load its replica"
        assert got_other[1 - x] == 4 and got_first[x] == 4, (x, got_other, got_first)
    _()


def check_failover_and_drain(router, label, replicas):
    @check(f"{label}: one replica killed, every request answered by the other once the health check noticed")
    def _():
        dead, live = replicas
        dead.proc.send_signal(signal.SIGKILL)
        dead.proc.wait(10)
        time.sleep(HEALTH_INTERVAL_S * 3 + 1)  # the router's checks (every second, one failure) see it
        before = live.metric("fathom:requests_received_total")
        failed = 0
        for i in range(8):
            r = requests.post(router.url + "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": f"Tell me about boat {i}."}],
                "max_tokens": 8, "temperature": 0}, timeout=60)
            failed += r.status_code != 200
        served = live.metric("fathom:requests_received_total") - before
        print(f"  failed {failed} of 8; the live replica served {served:g}")
        assert failed == 0 and served == 8, (failed, served)
    _()

    @check(f"{label}: SIGTERM on a replica while a request streams through the router: the request completes")
    def _():
        live = replicas[1]
        body = {"model": "m", "prompt": "The sea is", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        signalled_at, refused = [], []

        def probe_while_draining():
            time.sleep(0.2)
            try:  # a new request straight to the draining replica is refused; its health is down
                r = requests.post(live.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
                h = requests.get(live.url + "/health", timeout=5)
                refused.append((r.status_code, h.status_code))
            except requests.RequestException as e:
                refused.append(repr(e))

        prober = threading.Thread(target=probe_while_draining)
        with requests.post(router.url + "/v1/completions", json=body, stream=True, timeout=120) as resp:
            assert resp.status_code == 200, resp.text
            events = []
            for t, c in sse_events(resp):
                events.append((t, c))
                if not signalled_at and c.get("choices"):
                    live.proc.send_signal(signal.SIGTERM)
                    signalled_at.append(time.time())
                    prober.start()
        prober.join()
        after = [c for t, c in events if t > signalled_at[0]]
        finish = [c["choices"][0]["finish_reason"] for _, c in events if c.get("choices") and c["choices"][0]["finish_reason"]]
        usage = [c["usage"] for _, c in events if c.get("usage")]
        print(f"  {len(after)} of {len(events)} events arrived after SIGTERM; finish {finish}; "
              f"new request / health while draining: {refused}")
        assert finish == ["length"] and usage and usage[-1]["completion_tokens"] == 400, (finish, usage)
        assert len(after) >= 10, len(after)
        assert refused == [(503, 503)], refused
        assert live.proc.wait(30) == 0
    _()


def run_router(fathom, kind):
    label = {"vllm": "vllm-router", "sglang": "sglang-router"}[kind]
    replicas = [Server(fathom, MODEL, "--served-model-name", "m", "--tool-call-parser", "hermes",
                       "--enable-auto-tool-choice") for _ in range(2)]
    router = None
    try:
        router = Router(kind, [s.url for s in replicas])
        check_api(router, label)
        check_prefix_routing(router, label, replicas)
        check_failover_and_drain(router, label, replicas)
    finally:
        if router:
            router.stop()
        for s in replicas:
            if s.alive():
                s.stop()


def check_drain_timeout(fathom):
    @check("--shutdown-timeout bounds the drain: a request still running then ends with finish_reason abort")
    def _():
        srv = Server(fathom, MODEL, "--shutdown-timeout", "0.5")
        try:
            body = {"prompt": "The sea is", "max_tokens": 8000, "temperature": 0, "ignore_eos": True, "stream": True}
            with requests.post(srv.url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
                t0 = None
                for _, c in sse_events(resp):
                    if t0 is None:
                        srv.proc.send_signal(signal.SIGTERM)
                        t0 = time.time()
                    last = c
            took = time.time() - t0
            print(f"  the stream ended {took:.2f} s after SIGTERM: {last['choices'][0]['finish_reason']}")
            assert last["choices"][0]["finish_reason"] == "abort" and 0.4 < took < 5, (last, took)
            assert srv.proc.wait(10) == 0
        finally:
            if srv.alive():
                srv.stop()
    _()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    for kind in ("vllm", "sglang"):
        @check(f"{kind} router starts in front of two replicas")
        def _():
            run_router(args.fathom, kind)
        _()
    check_drain_timeout(args.fathom)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
