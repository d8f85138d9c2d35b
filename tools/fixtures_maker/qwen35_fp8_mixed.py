"""qwen35_moe_fp8_mixed (+ _w4a16_head): ModelOpt MIXED_PRECISION, NVFP4 experts, FP8 W8A8 linears."""

import json
import os
import shutil
from collections import OrderedDict

import numpy as np
import torch

from .bookkeeping import finish_fixture, tensor_stats
from .common import PROMPT_LENGTHS, SEED
from .fp8 import FP8_MAX, fp8_tensor_dequantize, fp8_tensor_quantize
from .goldens import compute_goldens
from .nvfp4 import nvfp4_dequantize, nvfp4_quantize
from .qwen35 import make_mtp_fn
from .qwen35_derived import (FP8_COUNTING_RULE, WRAP, calibrate_qwen35, check_goldens_weights, dequantize_dir,
                             load_qwen35_base, load_weights_, logit_gap, per_expert, q35_fp8_modules, rel_err,
                             start_derived_fixture, w8a8_teacher_forced)
from .st_io import edit_json, pack_shards, write_sharded


def fixture_qwen35_fp8_mixed(out, dev, prompts, base_dir, name="qwen35_moe_fp8_mixed", w4a16_head=False):
    """ModelOpt MIXED_PRECISION (nvidia/Qwen3.5-397B-A17B-NVFP4-V2 recipe): routed experts NVFP4 per
    expert, attention / GDN qkv,z,out / shared expert FP8 per tensor (W8A8, static input scale),
    FP8 KV cache scales on the full-attention layers; with w4a16_head the lm_head is W4A16 NVFP4
    (the Qwen3.6-35B-A3B-NVFP4 variant)."""
    d, base_model, mtp_sd, src = start_derived_fixture(out, name, base_dir, dev)
    tc = base_model.config.text_config
    E, I = tc.num_experts, tc.moe_intermediate_size
    fp8_mods = q35_fp8_modules(tc)
    cal = calibrate_qwen35(base_model, prompts, dev, fp8_mods)
    # bf16 reference logits on the golden prompts are computed later with this same model
    dst, deq, qlayers, orig = OrderedDict(), OrderedDict(), OrderedDict(), {}

    def put_nvfp4(prefix, w, scale_2, input_amax):
        packed, s, s2 = nvfp4_quantize(w, scale_2)
        dst[prefix + ".weight"], dst[prefix + ".weight_scale"], dst[prefix + ".weight_scale_2"] = packed, s, s2
        if input_amax is not None:
            dst[prefix + ".input_scale"] = torch.tensor(input_amax / (6.0 * 448.0), dtype=torch.float32)
        deq[prefix] = nvfp4_dequantize(packed, s, s2)
        orig[prefix] = w.float()

    for k, v in src.items():
        if k.startswith("mtp."):
            continue
        m = k[: -len(".weight")] if k.endswith(".weight") else None
        if k.endswith("experts.gate_up_proj"):
            lp = k[: -len(".experts.gate_up_proj")]
            L = int(lp[len(WRAP):].split(".")[0])
            for e in range(E):
                g, u = v[e, :I].float(), v[e, I:].float()
                s2 = torch.maximum(g.abs().amax(), u.abs().amax()) / (6.0 * 448.0)  # gate/up share scale_2
                put_nvfp4(f"{lp}.experts.{e}.gate_proj", g, s2, cal["moe_in"][L])
                put_nvfp4(f"{lp}.experts.{e}.up_proj", u, s2, cal["moe_in"][L])
                put_nvfp4(f"{lp}.experts.{e}.down_proj", src[f"{lp}.experts.down_proj"][e].float(), None,
                          cal["inter"][L])
            qlayers[f"{lp}.experts"] = {"quant_algo": "NVFP4", "group_size": 16}
        elif k.endswith("experts.down_proj"):
            pass  # with gate_up_proj
        elif m in fp8_mods:
            q, s = fp8_tensor_quantize(v)
            dst[k], dst[m + ".weight_scale"] = q, s
            dst[m + ".input_scale"] = torch.tensor(cal["inputs"][m] / FP8_MAX, dtype=torch.float32)
            deq[m], orig[m] = fp8_tensor_dequantize(q, s), v.float()
            qlayers[m] = {"quant_algo": "FP8"}
            if m.endswith("self_attn.k_proj") or m.endswith("self_attn.v_proj"):
                L = int(m[len(WRAP):].split(".")[0])
                kv = "k" if m.endswith("k_proj") else "v"
                dst[f"{m}.{kv}_scale"] = torch.tensor(cal[kv][L] / FP8_MAX, dtype=torch.float32)
        elif w4a16_head and k == "lm_head.weight":
            put_nvfp4("lm_head", v.float(), None, None)  # weight-only: no input_scale
            qlayers["lm_head"] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        else:
            dst[k] = v
    mtp_dst = per_expert(mtp_sd, E, I)  # MTP: BF16, experts per expert (as the nvfp4 fixture)
    shards = pack_shards(dst, 200 * 1000)
    shards.append(("mtp.safetensors", mtp_dst))
    write_sharded(d, shards)

    # ---- configs
    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(base_dir, f), os.path.join(d, f))
    qlayers = OrderedDict(sorted(qlayers.items()))
    gdn = [L for L, t in enumerate(tc.layer_types) if t != "full_attention"]
    exclude = ((["lm_head"] if not w4a16_head else []) + ["model.visual*", "mtp*"] +
               [f"{WRAP}{L}.linear_attn.{p}" for L in gdn for p in ("in_proj_a", "in_proj_b")])
    producer = {"name": "modelopt", "version": "0.x"}
    hfq = {"producer": producer, "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                                                  "quantized_layers": qlayers, "exclude_modules": exclude}}
    with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
        json.dump(hfq, f, indent=2)
        f.write("\n")
    fp8_grp = {"dynamic": False, "num_bits": 8, "type": "float"}
    fp4_grp = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    groups = {"group_0": {"input_activations": dict(fp8_grp), "weights": dict(fp8_grp),
                          "targets": [m for m, c in qlayers.items() if c["quant_algo"] == "FP8"]},
              "group_1": {"input_activations": dict(fp4_grp), "weights": dict(fp4_grp),
                          "targets": [m for m, c in qlayers.items() if c["quant_algo"] == "NVFP4"]}}
    if w4a16_head:
        groups["group_2"] = {"weights": dict(fp4_grp),
                             "targets": [m for m, c in qlayers.items() if c["quant_algo"] == "W4A16_NVFP4"]}

    def add_qc(cfg):
        cfg["quantization_config"] = {
            "config_groups": groups, "ignore": exclude, "quant_algo": "MIXED_PRECISION",
            "kv_cache_quant_algo": "FP8", "kv_cache_scheme": dict(fp8_grp), "quantized_layers": qlayers,
            "producer": producer, "quant_method": "modelopt"}
    edit_json(os.path.join(d, "config.json"), add_qc)

    # ---- goldens: the bf16 architecture in fp32 with the dequantized weights
    flat, _ = dequantize_dir(d, E, fuse=False)
    assert all(torch.equal(flat[m + ".weight"], w) for m, w in deq.items())
    main, _ = dequantize_dir(d, E)
    load_weights_(base_model, main)
    ref = base_model
    nchk = check_goldens_weights(d, ref, mtp_sd, E)
    goldens, info = compute_goldens(ref, dev, base_model=ref.model, mtp=make_mtp_fn(ref, mtp_sd, dev))
    gp = [goldens[f"prompt_{i}"] for i in range(len(PROMPT_LENGTHS))]
    scales = OrderedDict((m, dst[m + ".input_scale"]) for m in fp8_mods)
    w8 = w8a8_teacher_forced(ref, scales, gp, dev)
    lg = [goldens[f"logits_{i}"] for i in range(len(gp))]
    for i, x in enumerate(w8):
        goldens[f"w8a8_logits_{i}"] = x
    # the unquantized base on the same prompts (how far quantization moves the logits)
    bf16_model, _ = load_qwen35_base(base_dir, dev)
    with torch.no_grad():
        bl = [bf16_model(input_ids=p[None].long().to(dev)).logits[0].float().cpu() for p in gp]
    del bf16_model
    fp8_rel = [rel_err(deq[m], orig[m]) for m in deq if m in qlayers and qlayers[m]["quant_algo"] == "FP8"]
    fp4_rel = [rel_err(deq[m], orig[m]) for m in deq if m not in qlayers or qlayers[m]["quant_algo"] != "FP8"]
    w8_gap = [float((a - b).abs().max() / (b.max() - b.min())) for a, b in zip(w8, lg)]
    w8_med = [float(((a - b).abs().amax(-1) / (b.max() - b.min())).median()) for a, b in zip(w8, lg)]
    w8r = w8a8_teacher_forced(ref, scales, gp, dev, reciprocal=True)
    stats, _ = tensor_stats(d)
    meta = finish_fixture(d, "Qwen3_5MoeForConditionalGeneration", "per_expert", goldens, info, OrderedDict([
        ("quantized_modules", stats["quantized_modules"]),
        ("counting_rule", FP8_COUNTING_RULE),
        ("base_fixture", "qwen35_moe"),
        ("quant_layout", "modelopt MIXED_PRECISION (nvidia/Qwen3.5-397B-A17B-NVFP4-V2 recipe)"
                         + (" + W4A16_NVFP4 lm_head (Qwen3.6-35B-A3B-NVFP4 variant)" if w4a16_head else "")),
        ("fp8_modules", len(fp8_rel)),
        ("nvfp4_modules", len(fp4_rel)),
        ("fp8_format", "per tensor W8A8: weight F8_E4M3, weight_scale F32 [] = amax(W)/448 (own amax per module, "
                       "NOT unified across q/k/v or gate/up as ModelOpt's fused-linear export would), "
                       "q = e4m3(clamp(W / weight_scale, +-448)) with an fp32 division; "
                       "input_scale F32 [] = amax(module input over calibration)/448"),
        ("fp8_dequant_formula", "w = fp32(e4m3 weight) * weight_scale (fp32 multiply)"),
        ("nvfp4_dequant_formula", "w = e2m1(code) * (fp32(weight_scale) * weight_scale_2), fp32 (as qwen35_moe_nvfp4; "
                                  "gate/up share weight_scale_2; all experts of a layer share input_scale)"),
        ("lm_head", "W4A16_NVFP4: weight U8 [V, H/2], weight_scale F8_E4M3 [V, H/16], weight_scale_2 F32 [], "
                    "no input_scale" if w4a16_head else "BF16"),
        ("kv_scales", "self_attn.k_proj.k_scale = amax(post-k_norm, post-RoPE keys)/448, self_attn.v_proj.v_scale "
                      "= amax(v_proj output)/448, F32 [], full-attention layers only, NOT clamped to >= 1 (ModelOpt's "
                      "FP8 export clamps them to >= 1.0, so a real checkpoint usually carries 1.0); the MTP layer "
                      "has none; goldens do NOT quantize the KV cache"),
        ("kv_scale_values", {f"layer_{L}": {"k_scale": float(dst[f'{WRAP}{L}.self_attn.k_proj.k_scale']),
                                            "v_scale": float(dst[f'{WRAP}{L}.self_attn.v_proj.v_scale'])}
                             for L in sorted(cal["k"])}),
        ("calibration", f"max calibration on the bf16 qwen35_moe model (fp32 compute), prompts make_prompts({SEED}) "
                        f"(lengths {PROMPT_LENGTHS}), forward hooks; expert input_scale = amax/(6*448) as in "
                        "qwen35_moe_nvfp4"),
        ("mtp_experts_layout", "per_expert_bf16"),
        ("exclude_modules_note", "routers (*.mlp.gate), *.shared_expert_gate and mtp.fc are BF16; routers and "
                                 "shared_expert_gate are NOT listed in exclude_modules / ignore (quantized_layers is "
                                 "the authority); in_proj_a/in_proj_b, conv1d, norms, embeddings, vision BF16"),
        ("goldens_semantics", "logits/greedy/mtp_logits: weight-only (dequantized weights, fp32 activations, "
                              "unquantized KV); w8a8_logits_i: teacher-forced logits with every FP8 linear's input "
                              "x_q = fp32(e4m3(clamp(fp32(x) / input_scale, +-448))) * input_scale, then "
                              "F.linear(x_q, W_dequant); NVFP4 experts stay weight-only, KV unquantized"),
        ("w8a8_vs_logits_max_rel", max(w8_gap)),
        ("w8a8_vs_logits_max_rel_per_prompt", w8_gap),
        ("w8a8_vs_logits_median_row_rel_per_prompt", w8_med),
        ("w8a8_reciprocal_variant_vs_w8a8_max_rel", logit_gap(w8r, w8)),
        ("w8a8_reciprocal_variant_note", "the same W8A8 run quantizing x * fp32(1/input_scale) instead of "
                                         "x / input_scale: how far a legitimate engine variant lands from w8a8_logits"),
        ("w8a8_argmax_mismatch_rows", int(sum(int((a.argmax(-1) != b.argmax(-1)).sum()) for a, b in zip(w8, lg)))),
        ("weight_rel_error_note", "per module ||W_dequant - W_bf16||_F / ||W_bf16||_F"),
        ("fp8_relative_weight_error_max", max(fp8_rel)),
        ("fp8_relative_weight_error_mean", float(np.mean(fp8_rel))),
        ("nvfp4_relative_weight_error_max", max(fp4_rel)),
        ("nvfp4_relative_weight_error_mean", float(np.mean(fp4_rel))),
        ("lm_head_relative_weight_error", rel_err(deq["lm_head"], orig["lm_head"]) if w4a16_head else 0.0),
        ("logits_vs_bf16_base_max_rel", logit_gap(lg, bl)),
        ("goldens_weights_checked", f"{nchk} tensors: dequantized from the written files == weights used, bit exact"),
    ]))
    return d, meta
