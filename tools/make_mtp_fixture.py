#!/usr/bin/env python3
"""Build tests/fixtures/qwen35_moe_mtp_oracle: a Qwen3.5-MoE checkpoint whose next token is a fixed
function of the current one, and whose MTP layer predicts it exactly (for speculative decoding tests).

Usage:
    python tools/make_mtp_fixture.py [--src tests/fixtures/qwen35_moe] [--out tests/fixtures/qwen35_moe_mtp_oracle]

Needs numpy only (safetensors files are read and written by the few lines below; BF16 is kept as
raw uint16). The structure (config.json, tensor names, shapes, dtypes, shards) is copied from the
random fixture --src; values are copied too, then these are overridden:

  * every residual contribution is zero: full-attention o_proj, Gated DeltaNet out_proj, routed
    expert down_proj and shared-expert down_proj of every layer (and of the MTP layer), so the
    final hidden state is final_norm(embed(x)) whatever the context;
  * norms feeding the output are identity (zero-centred RMSNorm weight 0): model.norm,
    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm;
  * f = a random permutation of the token ids 2..vocab-1 (0 and 1 = eos never appear);
    lm_head[f(x)] = SCALE * h(x) / hidden_size where h(x) = embed[x] / rms(embed[x]) is the final
    hidden for x, so logit(f(x)) = SCALE and every other logit is SCALE * cos(h(x), h(x')), about
    N(0, (SCALE/8)^2) for hidden 64; lm_head rows 0 and 1 are zero;
  * mtp.fc = [I | 0]: the MTP reads only the (normalised) embedding of the next token, its layer
    adds nothing, mtp.norm makes it h(next), so the MTP logits peak at f(next) = the token after next.

So greedy decoding from x emits f(x), f(f(x)), ... and MTP drafts are always right (acceptance 1
at temperature 0). fathom_fixture.json records f, the margins, and the recipe.
"""

import argparse
import json
import os
import shutil
import struct

import numpy as np

SEED = 20250901
SCALE = 12.0

DTYPES = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "F16": (np.float16, 2), "I32": (np.int32, 4),
          "I64": (np.int64, 8), "U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        dt, size = DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dt).reshape(info["shape"]).copy()
        out[name] = (info["dtype"], arr)
    return out, meta


def write_safetensors(path, tensors, meta):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def to_f32(dtype, arr):
    return bf16_to_f32(arr) if dtype == "BF16" else arr.astype(np.float32)


def from_f32(dtype, x):
    return f32_to_bf16(x) if dtype == "BF16" else x.astype(DTYPES[dtype][0])


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--src", default=os.path.join(root, "tests/fixtures/qwen35_moe"))
    ap.add_argument("--out", default=os.path.join(root, "tests/fixtures/qwen35_moe_mtp_oracle"))
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(args.src, "config.json")))
    tc = cfg.get("text_config", cfg)
    V, H = tc["vocab_size"], tc["hidden_size"]
    assert tc.get("mtp_num_hidden_layers", 0) >= 1, "source fixture has no MTP layer"
    index = json.load(open(os.path.join(args.src, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    files = {s: read_safetensors(os.path.join(args.src, s)) for s in shards}
    allt = {}
    for s, (t, _) in files.items():
        for k, v in t.items():
            allt[k] = (s, v)

    def get(name):
        dtype, arr = allt[name][1]
        return to_f32(dtype, arr)

    def put(name, x):
        s, (dtype, arr) = allt[name]
        assert tuple(x.shape) == tuple(arr.shape), (name, x.shape, arr.shape)
        files[s][0][name] = (dtype, from_f32(dtype, x))
        allt[name] = (s, files[s][0][name])

    zeroed = []
    for name in list(allt):
        leaf = name.split(".")
        if (name.endswith("self_attn.o_proj.weight") or name.endswith("linear_attn.out_proj.weight")
                or name.endswith("mlp.experts.down_proj") or name.endswith("shared_expert.down_proj.weight")
                or (".experts." in name and name.endswith("down_proj.weight"))):
            put(name, np.zeros(allt[name][1][1].shape, np.float32))
            zeroed.append(name)
    prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in allt else "model."
    for name in [prefix + "norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                 "mtp.norm.weight"]:
        put(name, np.zeros(allt[name][1][1].shape, np.float32))

    rng = np.random.default_rng(SEED)
    perm = np.arange(V)
    perm[2:] = 2 + rng.permutation(V - 2)  # f(x) = perm[x]; f(0) = 0, f(1) = 1 are never used
    emb = get(prefix + "embed_tokens.weight")
    h = emb / np.sqrt(np.mean(emb * emb, axis=1, keepdims=True) + float(tc.get("rms_norm_eps", 1e-6)))
    lm = np.zeros((V, H), np.float32)
    for x in range(2, V):
        lm[perm[x]] = SCALE * h[x] / H
    put("lm_head.weight", lm)
    fc = np.zeros((H, 2 * H), np.float32)
    fc[:, :H] = np.eye(H, dtype=np.float32)
    put("mtp.fc.weight", fc)

    # Margins the engine will see (bf16-rounded weights, fp32 math).
    lm_b = bf16_to_f32(f32_to_bf16(lm))
    logits = h[2:] @ lm_b.T
    top = logits[np.arange(V - 2), perm[2:]]
    others = logits.copy()
    others[np.arange(V - 2), perm[2:]] = -np.inf
    margin = top - others.max(axis=1)

    os.makedirs(args.out, exist_ok=True)
    for fn in ("config.json", "generation_config.json", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(args.src, fn)):
            shutil.copy(os.path.join(args.src, fn), os.path.join(args.out, fn))
    for s, (t, meta) in files.items():
        write_safetensors(os.path.join(args.out, s), t, meta)
    info = {
        "architecture": cfg.get("architectures", ["?"])[0],
        "made_by": "tools/make_mtp_fixture.py",
        "source_fixture": os.path.basename(os.path.normpath(args.src)),
        "seed": SEED,
        "purpose": "speculative decoding oracle: next token = f(current token); the MTP layer predicts f(next) exactly",
        "next_token_map": "f(x) = next_token[x]; tokens 0 and 1 (eos) are never produced",
        "next_token": perm.tolist(),
        "logit_of_f_x": SCALE,
        "min_greedy_margin": float(margin.min()),
        "median_greedy_margin": float(np.median(margin)),
        "zeroed_tensors": len(zeroed),
        "recipe": ["o_proj, out_proj, experts.down_proj, shared_expert.down_proj = 0 (all layers + MTP)",
                   "model.norm, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm = 0 (zero-centred: identity)",
                   "lm_head[f(x)] = SCALE * rmsnorm(embed[x]) / hidden_size; rows 0, 1 = 0",
                   "mtp.fc = [I | 0] (embedding half only)"],
    }
    with open(os.path.join(args.out, "fathom_fixture.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"wrote {args.out}: vocab {V}, hidden {H}, {len(zeroed)} tensors zeroed, "
          f"greedy margin min {margin.min():.2f} median {np.median(margin):.2f}")


if __name__ == "__main__":
    main()
