#!/usr/bin/env python3
"""Load test: N concurrent streaming connections against a running `fathom serve` (not in CI).

Opens all connections at once (asyncio, raw HTTP/1.1, no third-party packages), each sending a
streaming /v1/completions request, and counts:
  completed  HTTP 200 and the stream ended with `data: [DONE]` after max_tokens tokens
  dropped    the connection was refused/reset, or a non-200 status came back
  lost       no error but the stream never finished within --timeout
Example:
  fathom serve tests/fixtures/qwen35_moe --device cpu --port 8000 --max-num-seqs 256 --max-queue-len 2048 &
  python3 bench/load_streaming.py --url http://127.0.0.1:8000 --connections 1000 --max-tokens 8
"""
import argparse
import asyncio
import json
import random
import resource
import time
from urllib.parse import urlparse


async def one(host, port, body, timeout, stats, ttfts):
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except Exception as e:  # noqa: BLE001
        stats["dropped"] += 1
        stats.setdefault("errors", {}).setdefault(type(e).__name__, 0)
        stats["errors"][type(e).__name__] += 1
        return
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    try:
        writer.write(req)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        if b" 200 " not in status_line:
            stats["dropped"] += 1
            stats.setdefault("status", {}).setdefault(status_line.decode(errors="replace").strip(), 0)
            stats["status"][status_line.decode(errors="replace").strip()] += 1
            return
        done, tokens, first = False, 0, None
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                stats["lost"] += 1
                return
            line = await asyncio.wait_for(reader.readline(), left)
            if not line:
                break
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    j = json.loads(payload)
                    if j.get("choices"):
                        tokens += len(j["choices"][0].get("token_ids") or [1])
                        if first is None:
                            first = time.perf_counter() - t0
                except ValueError:
                    pass
        if done:
            stats["completed"] += 1
            stats["tokens"] += tokens
            if first is not None:
                ttfts.append(first)
        else:
            stats["lost"] += 1
    except asyncio.TimeoutError:
        stats["lost"] += 1
    except Exception as e:  # noqa: BLE001
        stats["dropped"] += 1
        stats.setdefault("errors", {}).setdefault(type(e).__name__, 0)
        stats["errors"][type(e).__name__] += 1
    finally:
        writer.close()


async def main_async(a):
    u = urlparse(a.url)
    rng = random.Random(0)
    stats = {"completed": 0, "dropped": 0, "lost": 0, "tokens": 0}
    ttfts = []
    bodies = [json.dumps({"prompt": [rng.randrange(2, a.vocab - 16) for _ in range(a.input_len)], "max_tokens": a.max_tokens,
                          "ignore_eos": True, "temperature": 0, "stream": True, "return_token_ids": True}).encode()
              for _ in range(a.connections)]
    t0 = time.perf_counter()
    await asyncio.gather(*(one(u.hostname, u.port or 80, b, a.timeout, stats, ttfts) for b in bodies))
    dur = time.perf_counter() - t0
    ttfts.sort()
    print(f"connections: {a.connections}  input_len: {a.input_len}  max_tokens: {a.max_tokens}")
    print(f"completed: {stats['completed']}  dropped: {stats['dropped']}  lost: {stats['lost']}")
    print(f"duration: {dur:.2f} s  generated tokens: {stats['tokens']}  ({stats['tokens'] / dur:.1f} tok/s)")
    if ttfts:
        print(f"TTFT median {ttfts[len(ttfts) // 2] * 1e3:.0f} ms, p99 {ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] * 1e3:.0f} ms")
    for k in ("errors", "status"):
        if k in stats:
            print(f"{k}: {stats[k]}")
    return 0 if stats["completed"] == a.connections else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.connections + 256)), hard))
    raise SystemExit(asyncio.run(main_async(a)))


if __name__ == "__main__":
    main()
