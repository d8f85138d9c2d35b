"""The JSON side files: the quantization configs (hf_quant_config.json, config.json
quantization_config) of each format, config.json and generation_config.json."""

import json

from .common import FP8_BLOCK, GROUP


def exclude_modules(m, mtp_layers, shared_nvfp4):
    P = m.prefix
    ex = ["lm_head", f"{P}layers.*.linear_attn*", f"{P}layers.*.self_attn*"]
    if m.next:
        ex.append(f"{P}layers.*.mlp.gate")
    if m.moe and not shared_nvfp4:
        ex.append(f"{P}layers.*.mlp.shared_expert*")
    if m.multimodal:
        ex.append("model.visual*")
    ex += [f"mtp.layers.{j}*" for j in range(mtp_layers)]
    return ex


def quant_files(m, mtp_layers, shared_nvfp4):
    producer = {"name": "modelopt", "version": "0.x"}
    ex = exclude_modules(m, mtp_layers, shared_nvfp4)
    hf = {"producer": producer,
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP,
                           "exclude_modules": ex}}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}
    qc = {"config_groups": {"group_0": {"input_activations": dict(fp4), "weights": dict(fp4), "targets": ["Linear"]}},
          "ignore": ex, "quant_algo": "NVFP4", "kv_cache_scheme": None, "producer": producer,
          "quant_method": "modelopt"}
    return hf, qc


MODELOPT_MIXED_VERSION = "0.37.0"


def mixed_exclude_modules(m, mtp_layers, fmt):
    """BF16 modules of the ModelOpt MIXED_PRECISION formats, as patterns (exclude_modules / ignore)."""
    P = m.prefix
    ex = [] if fmt == "nvfp4-mixed" else ["lm_head"]
    if m.moe:
        ex.append(f"{P}layers.*.mlp.gate")
        if m.S > 0:
            ex.append(f"{P}layers.*.mlp.shared_expert_gate")
    if m.hybrid:
        ex += ([f"{P}layers.*.linear_attn.in_proj_ba"] if m.next
               else [f"{P}layers.*.linear_attn.in_proj_a", f"{P}layers.*.linear_attn.in_proj_b"])
        ex.append(f"{P}layers.*.linear_attn.conv1d")
    if m.multimodal:
        ex.append("model.visual*")
    if mtp_layers:
        ex.append("mtp.fc")
    ex += [f"mtp.layers.{j}*" for j in range(mtp_layers)]
    return ex


def mixed_quant_files(m, mtp_layers, fmt, quantized_layers):
    """hf_quant_config.json and config.json quantization_config of nvfp4-v2 / nvfp4-mixed."""
    producer = {"name": "modelopt", "version": MODELOPT_MIXED_VERSION}
    ex = mixed_exclude_modules(m, mtp_layers, fmt)
    hf = {"producer": producer,
          "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                           "quantized_layers": quantized_layers, "exclude_modules": ex}}
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}
    by_algo = {}
    for mod, q in quantized_layers.items():
        by_algo.setdefault(q["quant_algo"], []).append(mod)
    groups = {}
    if "FP8" in by_algo:
        groups[f"group_{len(groups)}"] = {"input_activations": dict(fp8), "weights": dict(fp8),
                                          "targets": by_algo["FP8"]}
    if "NVFP4" in by_algo:
        groups[f"group_{len(groups)}"] = {"input_activations": dict(fp4), "weights": dict(fp4),
                                          "targets": by_algo["NVFP4"]}
    if "W4A16_NVFP4" in by_algo:
        groups[f"group_{len(groups)}"] = {"weights": dict(fp4), "targets": by_algo["W4A16_NVFP4"]}
    qc = {"config_groups": groups, "ignore": ex, "quant_algo": "MIXED_PRECISION", "producer": producer,
          "quant_method": "modelopt", "quantized_layers": quantized_layers}
    if fmt == "nvfp4-v2":
        qc["kv_cache_quant_algo"] = "FP8"
        qc["kv_cache_scheme"] = dict(fp8)
    # nvfp4-mixed (Qwen3.6-35B-A3B-NVFP4): the FP8 KV-cache setting is only in hf_quant_config.json
    # (sglang#27906), so a reader has to read both files.
    return hf, qc


def fp8_block_quant_config(bf16_modules):
    """config.json quantization_config of Qwen's -FP8 releases (no hf_quant_config.json)."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "modules_to_not_convert": list(bf16_modules)}


def generation_config(m):
    qwen35_vocab = m.V > 248046
    end, im_end = (248044, 248046) if qwen35_vocab else (151643, 151645)
    g = {"bos_token_id": end, "pad_token_id": end, "eos_token_id": [im_end, end], "do_sample": True}
    if m.family in ("qwen3_5_moe", "qwen3_5"):
        g.update(temperature=0.6, top_k=20, top_p=0.95)
    else:
        g.update(temperature=0.7, top_k=20, top_p=0.8)
    return g


def out_config(cfg, m, num_layers, mtp_override, fmt, quant_cfg, src, seed):
    c = json.loads(json.dumps(cfg))
    t = c.get("text_config") or c
    t["num_hidden_layers"] = num_layers
    if mtp_override is not None and mtp_override != m.mtp_declared:
        # Declare what was written, so the loader neither expects missing mtp.* tensors nor ignores them.
        t["num_nextn_predict_layers" if m.next else "mtp_num_hidden_layers"] = mtp_override
    if t.get("layer_types"):
        t["layer_types"] = t["layer_types"][:num_layers]
    if m.next and t.get("mlp_only_layers"):
        t["mlp_only_layers"] = [i for i in t["mlp_only_layers"] if i < num_layers]
    c["_comment"] = (f"SYNTHETIC random weights ({fmt}, seed {seed}) written by tools/make_synthetic_checkpoint.py "
                     f"from {src}" + (f", cut to {num_layers} layers" if num_layers != m.L else ""))
    c.setdefault("dtype", "bfloat16")
    if quant_cfg is not None:
        c["quantization_config"] = quant_cfg
    return c
