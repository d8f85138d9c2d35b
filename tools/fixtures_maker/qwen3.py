"""qwen3_next (per-expert, no layer_types in config.json) and qwen3_dense (tied, single file)."""

import os
import shutil

import torch

from .bookkeeping import check_saved_equals, finish_fixture, load_ref, tensor_stats
from .common import EOS_ID, SEED, SHARD, VOCAB
from .goldens import compute_goldens
from .randomize import damp_eos_, randomize_
from .st_io import edit_json


def fixture_qwen3_next(out, dev, prompts):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    d = os.path.join(out, "qwen3_next")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(SEED + 10)
    gen = torch.Generator().manual_seed(SEED + 11)
    cfg = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096, rms_norm_eps=1e-6,
        full_attention_interval=4, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25),
        eos_token_id=EOS_ID,
    )
    model = Qwen3NextForCausalLM(cfg).float()
    randomize_(model, gen, norm_one_centred=True)
    damp_eos_(model, tied=False)
    gen_sd = {k: v.clone() for k, v in model.state_dict().items()}
    model.generation_config.eos_token_id = EOS_ID
    model.to(torch.bfloat16)
    model.save_pretrained(d, max_shard_size=SHARD)  # default: original (per-expert) format

    def drop_layer_types(c):
        c.pop("layer_types", None)
        c["full_attention_interval"] = 4
    edit_json(os.path.join(d, "config.json"), drop_layer_types)
    del model
    ref = load_ref(Qwen3NextForCausalLM, d, dev)
    assert ref.config.layer_types == ["linear_attention"] * 3 + ["full_attention"], ref.config.layer_types
    check_saved_equals(ref, gen_sd, "qwen3_next")
    goldens, info = compute_goldens(ref, dev)
    _, t = tensor_stats(d)
    layout = "per_expert" if any(".experts.0.gate_proj.weight" in k for k in t) else "fused"
    meta = finish_fixture(d, "Qwen3NextForCausalLM", layout, goldens, info, {
        "in_proj_fused": {"in_proj_qkvz": any("in_proj_qkvz" in k for k in t),
                          "in_proj_ba": any("in_proj_ba" in k for k in t)},
        "config_note": "layer_types removed from config.json; full_attention_interval=4",
    })
    return d, meta


def fixture_qwen3_dense(out, dev, prompts):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    d = os.path.join(out, "qwen3_dense")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(SEED + 20)
    gen = torch.Generator().manual_seed(SEED + 21)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
        tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=1e6),
        eos_token_id=EOS_ID, attention_bias=False, use_sliding_window=False,
    )
    model = Qwen3ForCausalLM(cfg).float()
    model.tie_weights()
    randomize_(model, gen, norm_one_centred=False, embed_std=0.4)
    damp_eos_(model, tied=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    gen_sd = {k: v.clone() for k, v in model.state_dict().items()}
    model.generation_config.eos_token_id = EOS_ID
    model.to(torch.bfloat16)
    model.save_pretrained(d)  # single file model.safetensors
    del model
    assert os.path.exists(os.path.join(d, "model.safetensors"))
    assert not os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    ref = load_ref(Qwen3ForCausalLM, d, dev)
    check_saved_equals(ref, gen_sd, "qwen3_dense")
    goldens, info = compute_goldens(ref, dev)
    _, t = tensor_stats(d)
    assert "lm_head.weight" not in t
    meta = finish_fixture(d, "Qwen3ForCausalLM", "none", goldens, info)
    return d, meta
