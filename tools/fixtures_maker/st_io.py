"""Safetensors helpers: read a checkpoint folder, write shards + index, edit json files."""

import glob
import json
import os
from collections import OrderedDict

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def read_dir_tensors(d):
    """All tensors of a checkpoint dir, in index/file order. Returns OrderedDict and name->file."""
    out, where = OrderedDict(), {}
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    files = [f for f in files if os.path.basename(f) != "goldens.safetensors"]
    for f in files:
        with safe_open(f, "pt") as sf:
            for k in sf.keys():
                out[k] = sf.get_tensor(k)
                where[k] = os.path.basename(f)
    return out, where


def dtype_str(t):
    return {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.int32: "I32",
            torch.float8_e4m3fn: "F8_E4M3", torch.float16: "F16"}[t.dtype]


def nbytes(t):
    return t.numel() * t.element_size()


def write_sharded(d, shards, index_name="model.safetensors.index.json"):
    """shards: list of (filename, OrderedDict). Writes files + index with total_size."""
    weight_map, total = OrderedDict(), 0
    for fname, tensors in shards:
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, fname),
                  metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += nbytes(v)
    idx = {"metadata": {"total_size": total},
           "weight_map": OrderedDict(sorted(weight_map.items()))}
    with open(os.path.join(d, index_name), "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")


def pack_shards(tensors, max_bytes):
    shards, cur, cur_b = [], OrderedDict(), 0
    for k, v in tensors.items():
        b = nbytes(v)
        if cur and cur_b + b > max_bytes:
            shards.append(cur)
            cur, cur_b = OrderedDict(), 0
        cur[k] = v
        cur_b += b
    if cur:
        shards.append(cur)
    n = len(shards)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]


def add_shard_to_index(d, fname, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, fname),
              metadata={"format": "pt"})
    p = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(p))
    for k, v in tensors.items():
        idx["weight_map"][k] = fname
        idx["metadata"]["total_size"] = int(idx["metadata"].get("total_size", 0)) + nbytes(v)
        if "total_parameters" in idx["metadata"]:
            idx["metadata"]["total_parameters"] = int(idx["metadata"]["total_parameters"]) + v.numel()
    idx["weight_map"] = OrderedDict(sorted(idx["weight_map"].items()))
    with open(p, "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")


def edit_json(path, fn):
    cfg = json.load(open(path))
    cfg = fn(cfg) or cfg
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
