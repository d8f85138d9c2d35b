"""A `fathom serve` process for GPU-machine scripts and tests, with the standard library only (the
GPU machine has no `requests` / `openai`): start it on a free port, wait for /health, post JSON."""
import contextlib
import json
import socket
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(fathom, model, args, env, log_path, timeout_s=450):
    """Starts `fathom serve MODEL --port P ARGS...` logging to log_path; returns (process, port) once
    /health answers, or (process, None) when the process exits first."""
    port = free_port()
    with open(log_path, "w") as log:
        p = subprocess.Popen([fathom, "serve", model, "--port", str(port), *args], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if p.poll() is not None:
            return p, None
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return p, port
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    p.kill()
    raise RuntimeError(f"fathom serve did not come up in {timeout_s} s (log: {log_path})")


def post(port, path, body, timeout_s=300):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=timeout_s))


def stop(p):
    p.terminate()
    p.wait()


@contextlib.contextmanager
def serving(fathom, model, args, env, log_path):
    """`with serving(...) as port:` a server up for the block, stopped after it; an exit before
    /health answers fails with the log's tail."""
    p, port = start(fathom, model, args, env, log_path)
    try:
        assert port, f"fathom serve exited: {open(log_path).read()[-3000:]}"
        yield port
    finally:
        stop(p)


def greedy_logprobs(port, prompt, max_tokens, top=5):
    """A greedy completion's tokens and each position's top-`top` logprobs ({token: logprob})."""
    lp = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "logprobs": top})["choices"][0]["logprobs"]
    return lp["tokens"], lp["top_logprobs"]


def get_text(port, path, timeout_s=30):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s).read().decode()
