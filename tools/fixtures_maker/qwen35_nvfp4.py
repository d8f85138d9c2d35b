"""qwen35_moe_nvfp4: qwen35_moe's routed + shared experts NVFP4 (ModelOpt per-expert layout)."""

import json
import os
import shutil
from collections import OrderedDict

import numpy as np
import torch

from .bookkeeping import finish_fixture, load_ref
from .goldens import compute_goldens
from .nvfp4 import nvfp4_dequantize, nvfp4_quantize
from .qwen35 import make_mtp_fn
from .st_io import edit_json, pack_shards, read_dir_tensors, write_sharded


def fixture_qwen35_nvfp4(out, dev, prompts, base_dir, base_model, mtp_sd):
    from transformers import Qwen3_5MoeForConditionalGeneration
    d = os.path.join(out, "qwen35_moe_nvfp4")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src, _ = read_dir_tensors(base_dir)
    tc = base_model.config.text_config
    E, I = tc.num_experts, tc.moe_intermediate_size

    # ---- calibration: activation amax of MoE inputs / expert intermediates (bf16 model, all prompts)
    moe_in_amax, inter_amax, sh_inter_amax = {}, {}, {}
    hooks = []
    for L, layer in enumerate(base_model.model.language_model.layers):
        def hook(mod, args, L=L):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            moe_in_amax[L] = max(moe_in_amax.get(L, 0.0), float(x.abs().max()))
            gu = torch.einsum("th,eoh->eto", x, mod.experts.gate_up_proj.float())
            a = torch.nn.functional.silu(gu[..., :I]) * gu[..., I:]
            inter_amax[L] = max(inter_amax.get(L, 0.0), float(a.abs().max()))
            se = mod.shared_expert
            b = torch.nn.functional.silu(se.gate_proj(x)) * se.up_proj(x)
            sh_inter_amax[L] = max(sh_inter_amax.get(L, 0.0), float(b.abs().max()))
        hooks.append(layer.mlp.register_forward_pre_hook(hook))
    with torch.no_grad():
        for p in prompts:
            base_model(input_ids=p[None].to(dev))
    for h in hooks:
        h.remove()

    # ---- build the state dict
    dst = OrderedDict()
    deq = {}  # module name -> dequantized fp32 weight used for goldens
    n_layers = tc.num_hidden_layers

    def put_q(prefix, w, scale_2, input_amax):
        packed, s, s2 = nvfp4_quantize(w, scale_2)
        dst[prefix + ".weight"] = packed
        dst[prefix + ".weight_scale"] = s
        dst[prefix + ".weight_scale_2"] = s2
        dst[prefix + ".input_scale"] = torch.tensor(input_amax / (6.0 * 448.0), dtype=torch.float32)
        deq[prefix] = nvfp4_dequantize(packed, s, s2)

    for k, v in src.items():
        if k.startswith("mtp."):
            continue
        pre = "model.language_model.layers."
        if k.startswith(pre) and (".mlp.experts." in k or ".mlp.shared_expert." in k):
            L = int(k[len(pre):].split(".")[0])
            lp = f"{pre}{L}.mlp"
            if k.endswith("experts.gate_up_proj"):
                for e in range(E):
                    g, u = v[e, :I].float(), v[e, I:].float()
                    s2 = torch.maximum(g.abs().amax(), u.abs().amax()) / (6.0 * 448.0)  # shared gate/up amax
                    put_q(f"{lp}.experts.{e}.gate_proj", g, s2, moe_in_amax[L])
                    put_q(f"{lp}.experts.{e}.up_proj", u, s2, moe_in_amax[L])
                    put_q(f"{lp}.experts.{e}.down_proj", src[f"{lp}.experts.down_proj"][e].float(), None,
                          inter_amax[L])
            elif k.endswith("experts.down_proj"):
                pass  # handled with gate_up_proj
            elif k.endswith("shared_expert.gate_proj.weight"):
                g = v.float()
                u = src[f"{lp}.shared_expert.up_proj.weight"].float()
                s2 = torch.maximum(g.abs().amax(), u.abs().amax()) / (6.0 * 448.0)
                put_q(f"{lp}.shared_expert.gate_proj", g, s2, moe_in_amax[L])
                put_q(f"{lp}.shared_expert.up_proj", u, s2, moe_in_amax[L])
                put_q(f"{lp}.shared_expert.down_proj", src[f"{lp}.shared_expert.down_proj.weight"].float(), None,
                      sh_inter_amax[L])
            elif k.endswith("shared_expert.up_proj.weight") or k.endswith("shared_expert.down_proj.weight"):
                pass
            else:
                raise KeyError(k)
        else:
            dst[k] = v
    # MTP block: BF16, experts split per expert
    mtp_dst = OrderedDict()
    for k, v in mtp_sd.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(E):
                mtp_dst[f"{base}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                mtp_dst[f"{base}{e}.up_proj.weight"] = v[e, I:].contiguous()
                mtp_dst[f"{base}{e}.down_proj.weight"] = mtp_sd[base + "down_proj"][e].contiguous()
        elif k.endswith("experts.down_proj"):
            continue
        else:
            mtp_dst[k] = v
    shards = pack_shards(dst, 200 * 1000)
    shards.append(("mtp.safetensors", mtp_dst))
    write_sharded(d, shards)

    # ---- configs
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(base_dir, f), os.path.join(d, f))
    exclude = ["lm_head", "model.language_model.layers.*.linear_attn*", "model.language_model.layers.*.self_attn*",
               "model.visual*", "mtp.layers.0*"]
    producer = {"name": "modelopt", "version": "0.x"}
    hfq = {"producer": producer, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                                  "group_size": 16, "exclude_modules": exclude}}
    with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
        json.dump(hfq, f, indent=2)
        f.write("\n")
    grp = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}

    def add_qc(cfg):
        cfg["quantization_config"] = {
            "config_groups": {"group_0": {"input_activations": dict(grp), "weights": dict(grp), "targets": ["Linear"]}},
            "ignore": exclude, "quant_algo": "NVFP4", "kv_cache_scheme": None, "producer": producer,
            "quant_method": "modelopt"}
    edit_json(os.path.join(d, "config.json"), add_qc)

    # ---- verify: dequantize from the written files == values used
    written, _ = read_dir_tensors(d)
    for prefix, w in deq.items():
        w2 = nvfp4_dequantize(written[prefix + ".weight"], written[prefix + ".weight_scale"],
                              written[prefix + ".weight_scale_2"])
        assert torch.equal(w2, w), prefix
        assert written[prefix + ".weight_scale_2"].shape == () and written[prefix + ".input_scale"].shape == ()
    rel = []
    for prefix, w in deq.items():
        if ".experts." in prefix and ".shared_expert." not in prefix:
            L = int(prefix.split(".")[3])
            e = int(prefix.split(".")[6])
            which = prefix.split(".")[-1]
            lp = f"model.language_model.layers.{L}.mlp.experts"
            orig = (src[lp + ".gate_up_proj"][e, :I] if which == "gate_proj" else
                    src[lp + ".gate_up_proj"][e, I:] if which == "up_proj" else src[lp + ".down_proj"][e]).float()
        else:
            orig = src[prefix + ".weight"].float()
        rel.append(float((w - orig).norm() / orig.norm()))

    # ---- goldens from the dequantized weights (fp32) in the bf16 architecture
    ref = load_ref(Qwen3_5MoeForConditionalGeneration, base_dir, dev)
    with torch.no_grad():
        for L, layer in enumerate(ref.model.language_model.layers):
            lp = f"model.language_model.layers.{L}.mlp"
            ex = layer.mlp.experts
            for e in range(E):
                ex.gate_up_proj[e].copy_(torch.cat([deq[f"{lp}.experts.{e}.gate_proj"],
                                                    deq[f"{lp}.experts.{e}.up_proj"]], 0).to(dev))
                ex.down_proj[e].copy_(deq[f"{lp}.experts.{e}.down_proj"].to(dev))
            for n in ("gate_proj", "up_proj", "down_proj"):
                getattr(layer.mlp.shared_expert, n).weight.copy_(deq[f"{lp}.shared_expert.{n}"].to(dev))
    mtp_fn = make_mtp_fn(ref, mtp_sd, dev)
    goldens, info = compute_goldens(ref, dev, base_model=ref.model, mtp=mtp_fn)
    meta = finish_fixture(d, "Qwen3_5MoeForConditionalGeneration", "per_expert", goldens, info, {
        "nvfp4_relative_weight_error_mean": float(np.mean(rel)),
        "nvfp4_dequant_formula": "w = e2m1(code) * (fp32(weight_scale) * weight_scale_2), fp32; "
                                 "goldens = HF bf16 architecture run in fp32 with these dequantized weights",
        "mtp_experts_layout": "per_expert_bf16",
        "exclude_modules_note": "routers (*.mlp.gate), *.shared_expert_gate and mtp.fc are BF16 but deliberately "
                                "NOT listed in exclude_modules / ignore (like the real checkpoint)",
    })
    return d, meta
