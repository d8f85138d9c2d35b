#!/usr/bin/env python3
"""`fathom serve` under connection pressure (CPU backend, tiny fixture): idle connections, slow
clients (slowloris), the connection limit with idle eviction and 503 + Retry-After, and malformed
HTTP. The server must keep answering /health in under a second and keep serving completions.

Run by ctest as: python3 test_server_connections.py --fathom BIN --fixtures FIXTURES_DIR
"""
import argparse
import os
import socket
import sys
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_util import Server, check, raise_fd_limit, summary  # noqa: E402


def open_idle(port, count):
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
    return socks


def health_seconds(url):
    t0 = time.perf_counter()
    r = requests.get(url + "/health", timeout=5)
    assert r.status_code == 200, r.status_code
    return time.perf_counter() - t0


def completion_ok(url, name):
    r = requests.post(url + "/v1/completions", json={"model": name, "prompt": [5, 6, 7], "max_tokens": 4,
                                                     "temperature": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text[:200]


def wait_for_connections(srv, at_most, seconds=10):
    """Waits until the server counts at most `at_most` open connections (this query's included).
    Until it has seen the closes, a query past the limit may itself get a 503: it is retried."""
    deadline = time.time() + seconds
    while True:
        try:
            if srv.metric("fathom:http_connections_open") <= at_most:
                return
        except (KeyError, ValueError, requests.RequestException):
            pass
        assert time.time() < deadline, "the server still counts closed connections"
        time.sleep(0.05)


def closed_by_server(s):
    """Whether the server has closed this socket (EOF or reset), without blocking."""
    s.setblocking(False)
    try:
        data = s.recv(65536)
        return data == b"" or data.startswith(b"HTTP/1.1 4") or data.startswith(b"HTTP/1.1 5")
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    model = os.path.join(args.fixtures, "qwen35_moe")
    limit = raise_fd_limit()
    assert limit >= 2200, f"the open-file limit ({limit}) is too low for 2,000 connections"

    srv = Server(args.fathom, model, "--http-idle-timeout", "60", "--http-request-timeout", "4")
    try:
        @check("2,000 idle connections: /health < 1 s and a completion succeeds")
        def _():
            socks = open_idle(srv.port, 2000)
            try:
                deadline = time.time() + 10  # every connection accepted (this query's included)
                while srv.metric("fathom:http_connections_open") < 2001:
                    assert time.time() < deadline, srv.metric("fathom:http_connections_open")
                    time.sleep(0.05)
                worst = max(health_seconds(srv.url) for _ in range(5))
                print(f"  /health with 2,000 idle connections: worst of 5 {worst * 1000:.1f} ms")
                assert worst < 1.0, worst
                completion_ok(srv.url, model)
            finally:
                for s in socks:
                    s.close()
        _()

        @check("50 slowloris clients (a header byte per second): /health < 1 s, completions, then cut off")
        def _():
            line = b"GET /health HTTP/1.1\r\nHost: slow\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
            socks = open_idle(srv.port, 50)
            try:
                worst, t0 = 0.0, time.time()
                for k in range(6):  # 6 s of trickling, past the 4 s request deadline
                    for s in socks:
                        try:
                            s.send(line[k:k + 1])
                        except OSError:
                            pass
                    worst = max(worst, health_seconds(srv.url))
                    if k == 1:
                        completion_ok(srv.url, model)
                    time.sleep(max(0.0, t0 + k + 1 - time.time()))
                print(f"  /health under 50 slowloris clients: worst {worst * 1000:.1f} ms")
                assert worst < 1.0, worst
                cut = sum(closed_by_server(s) for s in socks)
                assert cut == 50, f"only {cut} of 50 slow clients were cut off by --http-request-timeout"
            finally:
                for s in socks:
                    s.close()
        _()

        @check("malformed HTTP gets 400 and the server carries on")
        def _():
            for raw in [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                        b"GET /health HTTP/1.1\r\nBad Header Line\r\n\r\n"]:
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
                s.sendall(raw)
                reply = s.recv(4096)
                s.close()
                assert reply.startswith(b"HTTP/1.1 400"), (raw, reply[:100])
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100000 + b"\r\n\r\n")
            reply = s.recv(4096)
            s.close()
            assert reply.startswith(b"HTTP/1.1 431"), reply[:100]
            assert health_seconds(srv.url) < 1.0
        _()
    finally:
        srv.stop()

    small = Server(args.fathom, model, "--max-connections", "32", "--http-idle-timeout", "60",
                   "--http-request-timeout", "30")
    try:
        @check("connection limit: idle connections are closed first, busy ones get 503 + Retry-After")
        def _():
            idle = open_idle(small.port, 40)  # past the limit: the oldest idle ones make room
            time.sleep(0.3)
            assert small.metric("fathom:http_connections_open") <= 33
            evicted = sum(closed_by_server(s) for s in idle[:10])
            assert evicted >= 8, f"{evicted} of the 10 oldest idle connections were closed"
            assert health_seconds(small.url) < 1.0
            for s in idle:
                s.close()
            wait_for_connections(small, 1)
            # A connection whose request is being read is not idle. "Expect: 100-continue" makes
            # the server say when it has read a request's headers, so each connection is busy
            # before the next one opens: 32 fill the limit, and the next 8 get 503 (no idle one
            # is left to close for them).
            head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n")
            busy = []
            for _ in range(32):
                s = socket.create_connection(("127.0.0.1", small.port), timeout=10)
                s.sendall(head)
                reply = s.recv(64)
                assert reply.startswith(b"HTTP/1.1 100"), reply
                busy.append(s)
            refused = 0
            for _ in range(8):
                s = socket.create_connection(("127.0.0.1", small.port), timeout=10)
                data = s.recv(4096)
                s.close()
                if data.startswith(b"HTTP/1.1 503"):
                    assert b"Retry-After: 1" in data and b'"error"' in data, data
                    refused += 1
            assert refused == 8, f"{refused} of the 8 connections past the limit got 503"
            for s in busy:
                s.close()
            wait_for_connections(small, 1)
            assert health_seconds(small.url) < 1.0
            completion_ok(small.url, model)
        _()
    finally:
        small.stop()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
