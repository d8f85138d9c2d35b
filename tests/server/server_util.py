"""Helpers of the `fathom serve` end-to-end tests: a server process on a free port, named checks
that count passes and failures, and /metrics lookups."""
import json
import os
import socket
import subprocess
import time
import traceback

import openai
import requests

PASSED, FAILED = [], []


def check(name):
    """A named check: calling the decorated function runs it; a failure is recorded, not raised."""
    def deco(fn):
        def run(*a, **kw):
            t0 = time.time()
            try:
                fn(*a, **kw)
                PASSED.append(name)
                print(f"PASS {name} ({time.time() - t0:.1f}s)", flush=True)
            except Exception as e:  # noqa: BLE001
                FAILED.append(name)
                print(f"FAIL {name}: {e!r}", flush=True)
                traceback.print_exc()
        return run
    return deco


def summary():
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


def sse_events(resp):
    """(arrival time, parsed chunk) of each SSE event of a streamed `requests` response; raises
    unless [DONE] ends the stream."""
    for line in resp.iter_lines():
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            return
        yield time.time(), json.loads(line[6:])
    raise AssertionError("the stream ended without [DONE]")


def named_events(url, body, headers=None):
    """The (event name, data) pairs of a streamed response whose events are named ("event: X" then
    "data: {...}", as Anthropic's and OpenAI's Responses streams are), each data's type its name."""
    import requests
    r = requests.post(url, json=body, headers=headers or {}, stream=True, timeout=60)
    assert r.status_code == 200, r.text
    out, name = [], None
    for line in r.iter_lines():
        if line.startswith(b"event: "):
            name = line[7:].decode()
        elif line.startswith(b"data: "):
            data = json.loads(line[6:])
            assert data["type"] == name, (name, data)
            out.append((name, data))
    return out


def error_of(fn, error_type):
    """The `error_type` exception `fn()` raises (an SDK's status error); fails when it raises none."""
    try:
        fn()
    except error_type as e:
        return e
    raise AssertionError("no error")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_fd_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def stop_process(proc):
    """SIGTERM, then SIGKILL if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_until_up(proc, url, what, timeout_s=60, interval_s=0.1):
    """Polls `url` until it answers 200; fails if `proc` exits first or the time runs out."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{what} did not come up at {url}")


class Server:
    def __init__(self, fathom, model, *extra, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.devnull, "w") if not os.environ.get("FATHOM_TEST_VERBOSE") else None
        self.proc = subprocess.Popen([fathom, "serve", model, "--device", "cpu", "--host", "127.0.0.1",
                                      "--port", str(self.port), *extra], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env} if env else None)
        wait_until_up(self.proc, self.url + "/health", "server")

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def metric(self, name):
        text = requests.get(self.url + "/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        stop_process(self.proc)
