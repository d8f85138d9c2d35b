#!/usr/bin/env python3
"""The error bound of the shape sweep (issue 29), from transformers: for checkpoints kept by the
sweep (FATHOM_SWEEP_KEEP=DIR; each sweep_SEED folder holds the checkpoint, the 130-token prompt
and the fp32 CPU engine's logits of it), transformers runs the prompt in fp32 and in bf16.

Per config it prints, in the sweep's metric (a row's max |a - b| over the spread of the fp32
logits): transformers fp32 against Fathom's CPU engine (both fp32: they must agree to ~1e-5, which
checks that Fathom reads these random checkpoints as transformers does), and transformers bf16
against its own fp32 run: the error a bf16 engine is expected to have on that model. NVFP4
modules are dequantized to fp32 first (w = e2m1(code) * e4m3(scale) * scale_2), as the fixtures'
goldens are.

usage: shape_sweep_hf_bound.py KEEP_DIR [--max N] [--device cuda|cpu]
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def dequantize(packed, scale, scale_2):
    n, kh = packed.shape
    codes = torch.empty(n, kh * 2, dtype=torch.long)
    codes[:, 0::2] = (packed & 0xF).long()
    codes[:, 1::2] = (packed >> 4).long()
    vals = E2M1[codes].reshape(n, kh * 2 // 16, 16)
    return (vals * (scale.float() * scale_2.float()).unsqueeze(-1)).reshape(n, kh * 2)


def plain_copy(src, dst):
    """The checkpoint with NVFP4 modules dequantized and no quantization config."""
    tensors = {}
    for f in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
        with safe_open(f, "pt") as sf:
            for k in sf.keys():
                tensors[k] = sf.get_tensor(k)
    out = {}
    for k, t in tensors.items():
        if k.endswith(".weight_scale") or k.endswith(".weight_scale_2") or k.endswith(".input_scale"):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and t.dtype == torch.uint8 and base + ".weight_scale" in tensors:
            out[k] = dequantize(t, tensors[base + ".weight_scale"], tensors[base + ".weight_scale_2"])
        else:
            out[k] = t.float() if t.is_floating_point() else t
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))


def row_errors(got, ref):
    spread = float(ref.max() - ref.min())
    return np.abs(got - ref).max(axis=1) / spread


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("keep_dir")
    ap.add_argument("--max", type=int, default=40)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dirs = sorted(glob.glob(os.path.join(args.keep_dir, "sweep_*")))[: args.max]
    print("| seed | arch | fp32 vs Fathom CPU: median / max | transformers bf16 vs fp32: median / p95 / max | rows over 3e-2 |")
    print("|---|---|---|---|---|")
    for d in dirs:
        if not os.path.exists(os.path.join(d, "sweep_cpu_logits.f32")):
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        arch = cfg["architectures"][0]
        ids = torch.tensor([[int(x) for x in open(os.path.join(d, "sweep_prompt.txt")).read().split()]])
        with tempfile.TemporaryDirectory() as tmp:
            plain_copy(d, tmp)
            cls = getattr(transformers, arch)
            model, info = cls.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                              output_loading_info=True)
            missing = [k for k in info.get("missing_keys", []) if not (k.startswith("mtp.") or ".visual." in k
                                                                       or k.startswith("model.visual"))]
            if missing:  # e.g. Qwen3.5-MoE without a shared expert, which transformers' class always has
                print(f"| {os.path.basename(d)[6:]} | {arch} | not comparable: transformers expects {missing[0]} | | |")
                continue
            model = model.to(args.device).eval()
            with torch.no_grad():
                f32 = model(ids.to(args.device), use_cache=False).logits[0].float().cpu().numpy()
                model = model.to(torch.bfloat16)
                b16 = model(ids.to(args.device), use_cache=False).logits[0].float().cpu().numpy()
        vocab = f32.shape[1]
        cpu = np.fromfile(os.path.join(d, "sweep_cpu_logits.f32"), dtype=np.float32).reshape(-1, vocab)
        e_cpu = row_errors(cpu, f32)
        e_b16 = row_errors(b16, f32)
        print(f"| {os.path.basename(d)[6:]} | {arch} | {np.median(e_cpu):.1e} / {e_cpu.max():.1e} | "
              f"{np.median(e_b16):.1e} / {np.percentile(e_b16, 95):.1e} / {e_b16.max():.1e} | "
              f"{int((e_b16 >= 3e-2).sum())} of {len(e_b16)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
