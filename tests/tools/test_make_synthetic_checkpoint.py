#!/usr/bin/env python3
"""tools/make_synthetic_checkpoint.py: the quantized layouts of the current releases, read back with an
independent safetensors reader (8-byte length + JSON header, parsed here with json/struct; the
`safetensors` package is not needed).

For --format nvfp4-v2, nvfp4-mixed and fp8-block:
  * a small real write (the tiny qwen35_moe fixture config with widths that are not multiples of 128,
    so that the 128x128 FP8 blocks are partial; 4 layers = 3 Gated DeltaNet + 1 full attention, + MTP):
    headers, index, dtype strings, every FP8 weight with its scale(s) of the right shape, the config files'
    module lists against the tensors present, no NaN E4M3 code (0x7F/0xFF) in any F8_E4M3 tensor, the
    dequantized FP8 weights' std ~0.02; for fp8-block also a second run with the same seed over several
    shards, tensor for tensor byte-identical;
  * the full-width plan of configs/qwen3.5-35b-a3b (--dry-run --list-tensors --num-layers 4) and of
    configs/qwen3-next-80b-a3b (--num-layers 4): the same tensor-level checks at the real shapes.
Prints 'N passed, M failed'; exit 0 when all pass. The tool needs numpy (scripts/install_deps.sh puts
it in .venv, whose python3 ctest runs this with).

Usage: test_make_synthetic_checkpoint.py [--fathom BIN] [--fixtures FIXTURES_DIR]
"""
import argparse
import fnmatch
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(REPO, "tools", "make_synthetic_checkpoint.py")
DTYPE_SIZE = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
NEW_FORMATS = ("nvfp4-v2", "nvfp4-mixed", "fp8-block")
PASSED, FAILED = [], []


def check(name, fn, *a):
    t0 = time.time()
    try:
        fn(*a)
        PASSED.append(name)
        print(f"PASS {name} ({time.time() - t0:.1f}s)", flush=True)
    except Exception as e:  # noqa: BLE001
        FAILED.append(name)
        print(f"FAIL {name}: {e!r}", flush=True)
        traceback.print_exc()


def run_tool(*args):
    out = subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"tool failed ({out.returncode}):\n{out.stderr[-3000:]}"
    return out.stdout


# --------------------------------------------------------------------------------------------
# Independent reader
# --------------------------------------------------------------------------------------------


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    size = os.path.getsize(path)
    header.pop("__metadata__", None)
    end = 0
    for name, e in header.items():
        assert e["dtype"] in DTYPE_SIZE, f"{name}: dtype {e['dtype']!r}"
        a, b = e["data_offsets"]
        assert b - a == math.prod(e["shape"]) * DTYPE_SIZE[e["dtype"]], f"{name}: offsets {a}..{b} vs shape"
        end = max(end, b)
    spans = sorted(tuple(e["data_offsets"]) for e in header.values())
    for (a0, b0), (a1, _) in zip(spans, spans[1:]):
        assert b0 == a1, f"{path}: gap/overlap at {b0}..{a1}"
    assert size == 8 + n + end, f"{path}: size {size} != 8 + {n} + {end}"
    return 8 + n, header


def read_checkpoint(d):
    """{name: (dtype, shape, file, absolute offset)} for every tensor, checked against the index."""
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    tensors, total = {}, 0
    for fn in sorted(set(index["weight_map"].values())):
        base, header = read_header(os.path.join(d, fn))
        for name, e in header.items():
            assert name not in tensors, f"{name} twice"
            assert index["weight_map"].get(name) == fn, f"{name}: index says {index['weight_map'].get(name)}"
            tensors[name] = (e["dtype"], tuple(e["shape"]), fn, base + e["data_offsets"][0])
            total += e["data_offsets"][1] - e["data_offsets"][0]
    assert set(tensors) == set(index["weight_map"]), "index names != header names"
    assert index["metadata"]["total_size"] == total
    return tensors


def tensor_bytes(d, t):
    dtype, shape, fn, off = t
    with open(os.path.join(d, fn), "rb") as f:
        f.seek(off)
        return f.read(math.prod(shape) * DTYPE_SIZE[dtype])


def f32(d, t):
    assert t[0] == "F32" and t[1] == (), t
    return struct.unpack("<f", tensor_bytes(d, t))[0]


def e4m3(code):
    e, m = (code >> 3) & 0xF, code & 7
    v = m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -v if code & 0x80 else v


E4M3 = [e4m3(c) for c in range(256)]


# --------------------------------------------------------------------------------------------
# Checks on a {name: (dtype, shape, ...)} map (real checkpoint or dry-run listing)
# --------------------------------------------------------------------------------------------


def layer_kinds(names, prefix):
    """{layer prefix: 'full' | 'linear'} for main layers and MTP layers, from the tensor names."""
    kinds = {}
    for n in names:
        for p in (prefix + "layers.", "mtp.layers."):
            if n.startswith(p):
                i = n[len(p):].split(".")[0]
                lp = f"{p}{i}"
                if ".self_attn." in n:
                    kinds[lp] = "full"
                elif ".linear_attn." in n:
                    kinds.setdefault(lp, "linear")
    return kinds


def check_plan(ts, fmt, prefix, num_experts):
    """Tensor-level layout of one of the new formats (ts: name -> (dtype, shape, ...))."""
    dt = {n: t[0] for n, t in ts.items()}
    sh = {n: tuple(t[1]) for n, t in ts.items()}
    assert set(dt.values()) <= set(DTYPE_SIZE), set(dt.values())
    fp8_w = [n for n in ts if dt[n] == "F8_E4M3" and n.endswith(".weight")]
    fp4_w = [n for n in ts if dt[n] == "U8" and n.endswith(".weight")]
    assert fp8_w, "no FP8 weights"
    mtp_names = [n for n in ts if n.startswith("mtp.")]
    assert mtp_names, "no MTP tensors"
    for n in ts:
        assert not n.endswith(".weight") or dt[n] in ("BF16", "F8_E4M3", "U8"), (n, dt[n])
    assert dt[prefix + "embed_tokens.weight"] == "BF16"
    assert all(dt[n] == "F32" for n in ts if n.endswith(".A_log"))
    for n in ts:  # BF16 in every new format
        if any(n.endswith(s) for s in (".mlp.gate.weight", ".shared_expert_gate.weight", ".in_proj_a.weight",
                                       ".in_proj_b.weight", ".in_proj_ba.weight", ".conv1d.weight", ".dt_bias",
                                       "norm.weight")) or n == "mtp.fc.weight":
            assert dt[n] == "BF16", (n, dt[n])
    kinds = layer_kinds(ts, prefix)
    assert "full" in kinds.values() and "linear" in kinds.values(), kinds
    main_layers = [lp for lp in kinds if not lp.startswith("mtp.")]

    if fmt == "fp8-block":
        assert not fp4_w, fp4_w[:3]
        for n in fp8_w:
            o, i = sh[n]
            s = n[:-len(".weight")] + ".weight_scale_inv"
            assert dt.get(s) == "F32", (s, dt.get(s))
            assert sh[s] == (-(-o // 128), -(-i // 128)), (s, sh[s], (o, i))
            for bad in (".weight_scale", ".input_scale", ".weight_scale_2"):
                assert n[:-len(".weight")] + bad not in ts, n
        assert all(n[:-len("_scale_inv")] in fp8_w for n in ts if n.endswith(".weight_scale_inv"))
        assert dt["lm_head.weight"] == "BF16"
        for lp in list(kinds):  # MTP included
            attn = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
            gdn = ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"]
            if f"{lp}.linear_attn.in_proj_qkvz.weight" in ts:
                gdn = ["linear_attn.in_proj_qkvz", "linear_attn.out_proj"]
            mods = (attn if kinds[lp] == "full" else gdn)
            mods += [f"mlp.shared_expert.{p}_proj" for p in ("gate", "up", "down")]
            mods += [f"mlp.experts.{e}.{p}_proj" for e in range(num_experts) for p in ("gate", "up", "down")]
            for mod in mods:
                assert dt.get(f"{lp}.{mod}.weight") == "F8_E4M3", (lp, mod, dt.get(f"{lp}.{mod}.weight"))
        assert not any(".k_scale" in n or ".v_scale" in n for n in ts)
        return

    # ModelOpt MIXED_PRECISION
    for n in fp8_w:
        m = n[:-len(".weight")]
        assert dt.get(m + ".weight_scale") == "F32" and sh[m + ".weight_scale"] == (), m
        assert dt.get(m + ".input_scale") == "F32" and sh[m + ".input_scale"] == (), m
        assert m + ".weight_scale_2" not in ts and m + ".weight_scale_inv" not in ts, m
    for n in fp4_w:
        m = n[:-len(".weight")]
        o, half = sh[n]
        assert dt.get(m + ".weight_scale") == "F8_E4M3" and sh[m + ".weight_scale"] == (o, 2 * half // 16), m
        assert dt.get(m + ".weight_scale_2") == "F32" and sh[m + ".weight_scale_2"] == (), m
        if m == "lm_head":
            assert m + ".input_scale" not in ts, "W4A16 lm_head has an input_scale"
        else:
            assert dt.get(m + ".input_scale") == "F32" and sh[m + ".input_scale"] == (), m
    assert not any(n.startswith("mtp.") for n in fp8_w + fp4_w), "quantized MTP tensor"
    assert all(dt[n] in ("BF16", "F32") for n in mtp_names)
    assert dt["lm_head.weight"] == ("U8" if fmt == "nvfp4-mixed" else "BF16")
    if fmt == "nvfp4-mixed":
        V, H = sh[prefix + "embed_tokens.weight"]
        assert sh["lm_head.weight"] == (V, H // 2) and sh["lm_head.weight_scale"] == (V, H // 16)
    for lp in main_layers:
        if kinds[lp] == "full":
            for p in ("q", "k", "v", "o"):
                assert dt[f"{lp}.self_attn.{p}_proj.weight"] == "F8_E4M3", (lp, p)
            for s in ("self_attn.k_proj.k_scale", "self_attn.v_proj.v_scale"):
                assert dt.get(f"{lp}.{s}") == "F32" and sh[f"{lp}.{s}"] == (), (lp, s)
        else:
            assert not any(n.startswith(lp + ".") and (n.endswith("k_scale") or n.endswith("v_scale")) for n in ts)
        for p in ("gate", "up", "down"):
            assert dt[f"{lp}.mlp.shared_expert.{p}_proj.weight"] == "F8_E4M3", (lp, p)
            for e in range(num_experts):
                assert dt[f"{lp}.mlp.experts.{e}.{p}_proj.weight"] == "U8", (lp, e, p)


def check_mixed_configs(ts, fmt, d, num_experts):
    hf = json.load(open(os.path.join(d, "hf_quant_config.json")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    q = hf["quantization"]
    assert hf["producer"]["name"] == "modelopt"
    assert q["quant_algo"] == "MIXED_PRECISION" and q["kv_cache_quant_algo"] == "FP8", q
    ql = q["quantized_layers"]
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "MIXED_PRECISION"
    assert qc["quantized_layers"] == ql and qc["ignore"] == q["exclude_modules"]
    # nvfp4-v2 mirrors the KV-cache setting in config.json; nvfp4-mixed (Qwen3.6) has it only in hf_quant_config.
    assert qc.get("kv_cache_quant_algo") == ("FP8" if fmt == "nvfp4-v2" else None), qc.get("kv_cache_quant_algo")
    covered = set()
    for mod, a in ql.items():
        algo = a["quant_algo"]
        if mod.endswith(".mlp.experts"):
            assert a == {"quant_algo": "NVFP4", "group_size": 16}, (mod, a)
            for e in range(num_experts):
                for p in ("gate", "up", "down"):
                    n = f"{mod}.{e}.{p}_proj.weight"
                    assert ts.get(n, ("",))[0] == "U8", n
                    covered.add(n)
            continue
        n = mod + ".weight"
        assert n in ts, f"quantized_layers entry {mod}: no {n}"
        want = {"FP8": "F8_E4M3", "NVFP4": "U8", "W4A16_NVFP4": "U8"}[algo]
        assert ts[n][0] == want, (mod, algo, ts[n][0])
        if algo != "FP8":
            assert a.get("group_size") == 16, (mod, a)
        if algo == "W4A16_NVFP4":
            assert mod == "lm_head" and fmt == "nvfp4-mixed"
        covered.add(n)
    quantized = {n for n, t in ts.items() if n.endswith(".weight") and t[0] in ("U8", "F8_E4M3")}
    assert quantized == covered, f"not in quantized_layers: {sorted(quantized - covered)[:5]}"
    for pat in q["exclude_modules"]:
        hit = [m for m in ql if fnmatch.fnmatchcase(m, pat)]
        assert not hit, f"exclude pattern {pat} matches quantized {hit[:3]}"
    targets = [t for g in qc["config_groups"].values() for t in g["targets"]]
    assert sorted(targets) == sorted(ql), "config_groups targets != quantized_layers"


def check_fp8_block_config(ts, d):
    assert not os.path.exists(os.path.join(d, "hf_quant_config.json"))
    qc = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["fmt"] == "e4m3" and qc["activation_scheme"] == "dynamic"
    assert qc["weight_block_size"] == [128, 128]
    skip = set(qc["modules_to_not_convert"])
    for m in skip:
        assert ts.get(m + ".weight", ("",))[0] == "BF16", f"modules_to_not_convert {m}: no BF16 {m}.weight"
    for n, t in ts.items():  # every BF16 matrix (not norms / vectors) is listed; no FP8 module is
        m = n[:-len(".weight")]
        if n.endswith(".weight") and t[0] == "BF16" and len(t[1]) >= 2:
            assert m in skip, f"BF16 {n} not in modules_to_not_convert"
        if t[0] == "F8_E4M3":
            assert m not in skip and not any(s in n for s in skip), n
    for m in ("lm_head", "mtp.fc"):
        assert m in skip, m


def check_values(ts, d, fmt):
    nan = 0
    for n, t in ts.items():
        if t[0] == "F8_E4M3":
            b = tensor_bytes(d, t)
            nan += b.count(b"\x7f") + b.count(b"\xff")
    assert nan == 0, f"{nan} NaN E4M3 codes"
    stds = []
    for n, t in ts.items():
        if t[0] != "F8_E4M3" or not n.endswith(".weight"):
            continue
        m = n[:-len(".weight")]
        codes = tensor_bytes(d, t)
        o, i = t[1]
        if fmt == "fp8-block":
            s = ts[m + ".weight_scale_inv"]
            sb = tensor_bytes(d, s)
            sv = struct.unpack(f"<{len(sb) // 4}f", sb)
            cols = s[1][1]
            vals = [E4M3[c] * sv[(r // 128) * cols + (k // 128)] for r in range(o) for k, c in
                    enumerate(codes[r * i:(r + 1) * i])]
            assert all(0 < x < 1 for x in sv), (m, min(sv), max(sv))
        else:
            ws = f32(d, ts[m + ".weight_scale"])
            ins = f32(d, ts[m + ".input_scale"])
            assert 0 < ws < 1 and 0 < ins < 1, (m, ws, ins)
            vals = [E4M3[c] * ws for c in codes]
        stds.append(math.sqrt(sum(v * v for v in vals) / len(vals)))
    mean = sum(stds) / len(stds)
    assert 0.015 < mean < 0.027, f"mean dequantized FP8 std {mean}"
    if fmt != "fp8-block":
        for n, t in ts.items():
            if n.endswith(".k_scale") or n.endswith(".v_scale"):
                assert 1.0 <= f32(d, t) < 3.0, (n, f32(d, t))


# --------------------------------------------------------------------------------------------


def tiny_config(fixtures, tmp):
    """The qwen35_moe fixture config with widths that leave partial 128x128 blocks (all multiples of 16)."""
    c = json.load(open(os.path.join(fixtures, "qwen35_moe", "config.json")))
    t = c.get("text_config") or c
    t.update(hidden_size=144, moe_intermediate_size=160, shared_expert_intermediate_size=208, num_experts=4)
    path = os.path.join(tmp, "tiny_qwen35_moe.json")
    json.dump(c, open(path, "w"), indent=1)
    return path, t["num_experts"]


def listing(cfg, fmt, layers):
    out = run_tool(cfg, "/nonexistent-out", "--format", fmt, "--num-layers", str(layers), "--dry-run",
                   "--list-tensors")
    ts = {}
    for line in out.splitlines():
        if line.startswith("dry run:"):
            continue
        fn, name, dtype, shape = line.split("\t")
        ts[name] = (dtype, tuple(json.loads(shape)))
    return ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", help="unused (ctest passes it to every Python test)")
    ap.add_argument("--fixtures", default=os.path.join(REPO, "tests", "fixtures"))
    args = ap.parse_args()
    try:
        import numpy  # noqa: F401  (the tool's only dependency)
    except ImportError as e:
        print(f"FAIL: numpy is not importable by {sys.executable} ({e}); scripts/install_deps.sh installs it "
              "into .venv")
        print("0 passed, 1 failed")
        return 1

    with tempfile.TemporaryDirectory(prefix="synth_ckpt_") as tmp:
        cfg, E = tiny_config(args.fixtures, tmp)
        for fmt in NEW_FORMATS:
            d = os.path.join(tmp, fmt)

            def write_and_read(fmt=fmt, d=d):
                run_tool(cfg, d, "--format", fmt, "--quiet", "--jobs", "2")
                ts = read_checkpoint(d)
                check_plan(ts, fmt, "model.language_model.", E)
                if fmt == "fp8-block":
                    check_fp8_block_config(ts, d)
                else:
                    check_mixed_configs(ts, fmt, d, E)
                check_values(ts, d, fmt)
                if fmt != "fp8-block":
                    return
                # A small shard limit: same tensors over several files, the index still right.
                d2 = d + "-shards"
                run_tool(cfg, d2, "--format", fmt, "--quiet", "--shard-size-gb", "0.0002")
                ts2 = read_checkpoint(d2)
                assert len({t[2] for t in ts2.values()}) > 1, "expected several shards"
                assert {n: t[:2] for n, t in ts2.items()} == {n: t[:2] for n, t in ts.items()}
                assert all(tensor_bytes(d, ts[n]) == tensor_bytes(d2, ts2[n]) for n in ts), "not deterministic"
            check(f"{fmt}: tiny write read back (scales, config module lists, no NaN codes, std ~0.02)",
                  write_and_read)

        for fmt in NEW_FORMATS:
            def full_width(fmt=fmt):
                check_plan(listing("qwen3.5-35b-a3b", fmt, 4), fmt, "model.language_model.", 256)
                check_plan(listing("qwen3-next-80b-a3b", fmt, 4), fmt, "model.", 512)
            check(f"{fmt}: 35B-A3B and Qwen3-Next full-width plans (dry run)", full_width)

        def old_formats_unchanged():
            ts = listing("qwen3.5-35b-a3b", "nvfp4", 1)
            assert not any(t[0] == "F8_E4M3" and n.endswith(".weight") for n, t in ts.items())
            assert ts["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"][0] == "BF16"
            assert ts["model.language_model.layers.0.mlp.shared_expert.gate_proj.weight"][0] == "U8"
            ts = listing("qwen3.5-35b-a3b", "bf16", 1)
            assert {t[0] for t in ts.values()} == {"BF16", "F32"}
        check("nvfp4 / bf16 plans keep their layout", old_formats_unchanged)

    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
