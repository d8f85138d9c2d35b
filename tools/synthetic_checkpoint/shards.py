"""The shards: packing the plan into files, and streaming each safetensors file to disk (8-byte header
length, JSON header, the raw bytes) without holding it in memory."""

import json
import os
import struct
import sys
import threading
import time

from .common import DTYPE_SIZE
from .values import small_values


class Progress:
    def __init__(self, total, quiet=False):
        self.total, self.done, self.quiet = total, 0, quiet
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.stop = threading.Event()
        self.tty = sys.stderr.isatty()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def add(self, n):
        with self.lock:
            self.done += n

    def line(self):
        dt = max(time.time() - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"  {self.done / 1e9:7.2f} / {self.total / 1e9:.2f} GB ({pct:5.1f}%)  {rate / 1e9:5.2f} GB/s  "
                f"elapsed {dt:6.1f} s  eta {eta:6.1f} s")

    def _run(self):
        period = 1.0 if self.tty else 5.0
        while not self.stop.wait(period):
            if not self.quiet:
                print(("\r" if self.tty else "") + self.line(), end="" if self.tty else "\n", file=sys.stderr,
                      flush=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if not self.quiet:
            print(("\r" if self.tty else "") + self.line(), file=sys.stderr, flush=True)


CHUNK = 32 << 20


def write_shard(path, tensors, pools, seed, index_of, progress, fsync):
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb", buffering=4 << 20) as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        pending = 0
        for t in tensors:
            if t.kind == "scalar":
                f.write(struct.pack("<f", t.arg))
            elif t.kind == "small":
                f.write(small_values(t, seed, index_of[t.name]))
            else:
                pool = pools[t.kind]
                P, start, n = len(pool), t.arg, t.nbytes
                while n > 0:
                    k = min(n, P - start, CHUNK)
                    f.write(pool[start:start + k])
                    n -= k
                    start = 0 if start + k >= P else start + k
                    if k >= (1 << 20):
                        progress.add(k)
                    else:
                        pending += k
            if t.kind in ("scalar", "small"):
                pending += t.nbytes
            if pending >= (8 << 20):
                progress.add(pending)
                pending = 0
        progress.add(pending)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    expected = 8 + len(hb) + off
    actual = os.path.getsize(tmp)
    if actual != expected:
        raise RuntimeError(f"{tmp}: wrote {actual} bytes, expected {expected}")
    os.replace(tmp, path)
    return 8 + len(hb)


def pack_shards(tensors, shard_bytes, separate_mtp):
    """Greedy packing in plan order; a tensor bigger than the limit gets a shard of its own.
    Returns [(filename, [T...])]; tensors inside a shard sorted by dtype size (alignment)."""
    groups = {"model": [], "mtp": []}
    for t in tensors:
        groups["mtp" if (separate_mtp and t.group == "mtp") else "model"].append(t)
    shards, cur, cur_b = [], [], 0
    for t in groups["model"]:
        if cur and cur_b + t.nbytes > shard_bytes:
            shards.append(cur)
            cur, cur_b = [], 0
        cur.append(t)
        cur_b += t.nbytes
    if cur:
        shards.append(cur)
    n = len(shards)
    out = [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]
    if groups["mtp"]:
        out.append(("mtp.safetensors", groups["mtp"]))
    order = {t.name: i for i, t in enumerate(tensors)}
    return [(f, sorted(s, key=lambda t: (-DTYPE_SIZE[t.dtype], order[t.name]))) for f, s in out]
