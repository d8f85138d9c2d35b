"""qwen35_moe_fp8_block: Qwen's block FP8 release layout (quant_method fp8, weight_scale_inv)."""

import os
import shutil
from collections import OrderedDict

import numpy as np
import torch

from .bookkeeping import finish_fixture, tensor_stats
from .common import PROMPT_LENGTHS
from .fp8 import FP8_BLOCK, fp8_block_dequantize, fp8_block_quantize
from .goldens import compute_goldens
from .qwen35 import make_mtp_fn
from .qwen35_derived import (FP8_COUNTING_RULE, WRAP, check_goldens_weights, dequantize_dir, load_qwen35_base,
                             load_weights_, logit_gap, per_expert, q35_fp8_modules, rel_err, start_derived_fixture)
from .st_io import edit_json, pack_shards, write_sharded


def fixture_qwen35_fp8_block(out, dev, prompts, base_dir, name="qwen35_moe_fp8_block"):
    """Qwen's own FP8 releases (quant_method fp8, 128x128 blocks, weight_scale_inv)."""
    d, model, mtp_sd, src = start_derived_fixture(out, name, base_dir, dev)
    tc = model.config.text_config
    E, I = tc.num_experts, tc.moe_intermediate_size
    dense_fp8 = set(q35_fp8_modules(tc)) | {f"mtp.layers.0.{m}" for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")}
    rel, used_deq = [], {}

    def conv(k, v):
        """name, 2-D tensor -> tensors to write (FP8 block + weight_scale_inv, or as is)."""
        m = k[: -len(".weight")] if k.endswith(".weight") else None
        if m in dense_fp8 or (m and ".mlp.experts." in m):
            q, s = fp8_block_quantize(v)
            used_deq[k] = fp8_block_dequantize(q, s)
            rel.append(rel_err(used_deq[k], v.float()))
            return OrderedDict([(k, q), (k + "_scale_inv", s)])
        return OrderedDict([(k, v)])

    dst = per_expert(OrderedDict((k, v) for k, v in src.items() if not k.startswith("mtp.")), E, I, conv)
    mtp_dst = per_expert(mtp_sd, E, I, conv)
    n_fp8 = sum(1 for k in list(dst) + list(mtp_dst) if k.endswith("_scale_inv"))
    shards = pack_shards(dst, 200 * 1000)
    shards.append(("mtp.safetensors", mtp_dst))
    write_sharded(d, shards)

    for f in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(base_dir, f), os.path.join(d, f))
    gdn = [L for L, t in enumerate(tc.layer_types) if t != "full_attention"]
    not_convert = (["lm_head", "model.language_model.embed_tokens", "model.visual"] +
                   [f"{WRAP}{L}.linear_attn.{p}" for L in gdn for p in ("in_proj_a", "in_proj_b", "conv1d")] +
                   [f"{WRAP}{L}.mlp.{p}" for L in range(tc.num_hidden_layers) for p in ("gate", "shared_expert_gate")] +
                   ["mtp.fc", "mtp.layers.0.mlp.gate", "mtp.layers.0.mlp.shared_expert_gate"])

    def add_qc(cfg):
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
                                      "modules_to_not_convert": not_convert}
    edit_json(os.path.join(d, "config.json"), add_qc)

    # ---- goldens
    flat, flat_mtp = dequantize_dir(d, E, fuse=False)
    flat.update(flat_mtp)
    assert all(torch.equal(flat[k], w) for k, w in used_deq.items())
    main, mtp_deq = dequantize_dir(d, E)
    load_weights_(model, main)
    nchk = check_goldens_weights(d, model, mtp_deq, E)
    goldens, info = compute_goldens(model, dev, base_model=model.model, mtp=make_mtp_fn(model, mtp_deq, dev))
    gp = [goldens[f"prompt_{i}"] for i in range(len(PROMPT_LENGTHS))]
    lg = [goldens[f"logits_{i}"] for i in range(len(gp))]
    bf16_model, _ = load_qwen35_base(base_dir, dev)
    with torch.no_grad():
        bl = [bf16_model(input_ids=p[None].long().to(dev)).logits[0].float().cpu() for p in gp]
    del bf16_model
    stats, _ = tensor_stats(d)
    meta = finish_fixture(d, "Qwen3_5MoeForConditionalGeneration", "per_expert", goldens, info, OrderedDict([
        ("quantized_modules", n_fp8),
        ("counting_rule", FP8_COUNTING_RULE),
        ("base_fixture", "qwen35_moe"),
        ("quant_layout", "Qwen block FP8 (quant_method fp8, e4m3, weight_block_size [128, 128], dynamic activations)"),
        ("fp8_block_modules", n_fp8),
        ("fp8_block_modules_mtp", sum(1 for k in mtp_dst if k.endswith("_scale_inv"))),
        ("fp8_block_format", "weight F8_E4M3 [out, in]; weight_scale_inv F32 [ceil(out/128), ceil(in/128)] = "
                             "block amax/448 (1.0 for an all-zero block); q = e4m3(clamp(W / block scale, +-448)) "
                             "with an fp32 division; every in dim here is <= 128 (one block column, most blocks "
                             "partial: out 256 -> 2 block rows, 128/64/32 -> 1)"),
        ("fp8_dequant_formula", "w[i, j] = fp32(e4m3 weight[i, j]) * weight_scale_inv[i // 128, j // 128] (fp32 multiply)"),
        ("fp8_block_converted", "attention q/k/v/o, GDN in_proj_qkv/in_proj_z/out_proj, shared expert gate/up/down, "
                                "routed experts per expert (experts.{e}.{gate,up,down}_proj), MTP layer's attention, "
                                "shared expert and experts"),
        ("bf16_modules", "embeddings, lm_head, norms, routers (mlp.gate), shared_expert_gate, in_proj_a/in_proj_b, "
                         "A_log, dt_bias, conv1d, vision tower, mtp.fc (and the MTP norms/router)"),
        ("mtp_experts_layout", "per_expert_fp8_block"),
        ("goldens_semantics", "weight-only (W8A16): dequantized weights, fp32 activations; MTP goldens use the "
                              "dequantized MTP weights"),
        ("weight_rel_error_note", "per module ||W_dequant - W_bf16||_F / ||W_bf16||_F"),
        ("fp8_relative_weight_error_max", max(rel)),
        ("fp8_relative_weight_error_mean", float(np.mean(rel))),
        ("logits_vs_bf16_base_max_rel", logit_gap(lg, bl)),
        ("goldens_weights_checked", f"{nchk} tensors: dequantized from the written files == weights used, bit exact"),
    ]))
    return d, meta
