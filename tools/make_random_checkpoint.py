#!/usr/bin/env python3
"""Writes a mid-size random Qwen3.5-MoE checkpoint (bf16, routed experts in ModelOpt NVFP4) for
tests that need more than the tiny fixtures: long prompts over many KV pages, realistic head
dims. Not a golden: the CPU engine is the reference it is compared against.

usage: make_random_checkpoint.py OUT_DIR [--layers 8] [--seed 0]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    H, V, L = 512, 4096, args.layers
    nh, nkv, d = 8, 2, 128
    hk, hv, dk, dv, kc = 4, 8, 64, 64, 4
    E, K, I, S = 32, 4, 128, 128
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)]
    text = {
        "model_type": "qwen3_5_moe_text", "hidden_size": H, "num_hidden_layers": L, "vocab_size": V,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": d, "layer_types": layer_types,
        "linear_num_key_heads": hk, "linear_num_value_heads": hv, "linear_key_head_dim": dk,
        "linear_value_head_dim": dv, "linear_conv_kernel_dim": kc, "num_experts": E, "num_experts_per_tok": K,
        "moe_intermediate_size": I, "shared_expert_intermediate_size": S, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192, "hidden_act": "silu", "attn_output_gate": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        "eos_token_id": 1, "tie_word_embeddings": False, "mtp_num_hidden_layers": 0,
    }
    exclude = ["lm_head", "model.language_model.layers.*.linear_attn*", "model.language_model.layers.*.self_attn*"]
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": text, "tie_word_embeddings": False,
              "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": exclude}}
    t = {}

    def mat(name, out, inp):
        t[name] = (torch.randn(out, inp, generator=g) / inp ** 0.5).to(torch.bfloat16)

    def vec(name, n, mean=0.0, std=0.1):
        t[name] = (mean + std * torch.randn(n, generator=g)).to(torch.bfloat16)

    def fp4(name, out, inp):
        t[name + ".weight"] = torch.randint(0, 256, (out, inp // 2), generator=g, dtype=torch.uint8)
        scale = torch.randint(0x28, 0x38, (out, inp // 16), generator=g, dtype=torch.uint8)
        t[name + ".weight_scale"] = scale.view(torch.float8_e4m3fn)
        t[name + ".weight_scale_2"] = torch.tensor(1.0 / (3 * inp ** 0.5), dtype=torch.float32)
        t[name + ".input_scale"] = torch.tensor(1.0, dtype=torch.float32)

    p = "model.language_model."
    t[p + "embed_tokens.weight"] = torch.randn(V, H, generator=g).to(torch.bfloat16)
    vec(p + "norm.weight", H)
    mat("lm_head.weight", V, H)
    for i, lt in enumerate(layer_types):
        q = f"{p}layers.{i}."
        vec(q + "input_layernorm.weight", H)
        vec(q + "post_attention_layernorm.weight", H)
        if lt == "full_attention":
            mat(q + "self_attn.q_proj.weight", nh * d * 2, H)
            mat(q + "self_attn.k_proj.weight", nkv * d, H)
            mat(q + "self_attn.v_proj.weight", nkv * d, H)
            mat(q + "self_attn.o_proj.weight", H, nh * d)
            vec(q + "self_attn.q_norm.weight", d)
            vec(q + "self_attn.k_norm.weight", d)
        else:
            conv = 2 * hk * dk + hv * dv
            mat(q + "linear_attn.in_proj_qkv.weight", conv, H)
            mat(q + "linear_attn.in_proj_z.weight", hv * dv, H)
            mat(q + "linear_attn.in_proj_b.weight", hv, H)
            mat(q + "linear_attn.in_proj_a.weight", hv, H)
            mat(q + "linear_attn.out_proj.weight", H, hv * dv)
            t[q + "linear_attn.conv1d.weight"] = (0.5 * torch.randn(conv, 1, kc, generator=g)).to(torch.bfloat16)
            t[q + "linear_attn.A_log"] = torch.log(torch.empty(hv).uniform_(1, 16, generator=g)).float()
            t[q + "linear_attn.dt_bias"] = torch.randn(hv, generator=g).to(torch.bfloat16)
            vec(q + "linear_attn.norm.weight", dv, 1.0, 0.1)
        t[q + "mlp.gate.weight"] = (4 * torch.randn(E, H, generator=g) / H ** 0.5).to(torch.bfloat16)
        for e in range(E):
            fp4(f"{q}mlp.experts.{e}.gate_proj", I, H)
            fp4(f"{q}mlp.experts.{e}.up_proj", I, H)
            fp4(f"{q}mlp.experts.{e}.down_proj", H, I)
        mat(q + "mlp.shared_expert.gate_proj.weight", S, H)
        mat(q + "mlp.shared_expert.up_proj.weight", S, H)
        mat(q + "mlp.shared_expert.down_proj.weight", H, S)
        mat(q + "mlp.shared_expert_gate.weight", 1, H)
    os.makedirs(args.out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(args.out, "model.safetensors"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                                                                      "exclude_modules": exclude}}, f, indent=2)
    print(f"wrote {len(t)} tensors to {args.out}")


if __name__ == "__main__":
    main()
