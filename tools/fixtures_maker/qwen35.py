"""The bf16 qwen35_moe fixture: fused experts, tiny vision tower, one MTP layer in mtp.safetensors."""

import copy
import os
import shutil
from collections import OrderedDict

import torch

from .bookkeeping import check_saved_equals, finish_fixture, load_ref
from .common import EOS_ID, SEED, SHARD, VOCAB
from .goldens import compute_goldens, mtp_reference
from .randomize import damp_eos_, random_value, randomize_
from .st_io import add_shard_to_index


def q35_configs():
    from transformers import Qwen3_5MoeConfig
    tc = dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, max_position_embeddings=4096,
        rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[2, 1, 1], mrope_interleaved=True),
        eos_token_id=EOS_ID, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
    )
    vc = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, in_channels=3, out_hidden_size=64, num_position_embeddings=16)
    return Qwen3_5MoeConfig(text_config=tc, vision_config=vc, tie_word_embeddings=False)


def build_mtp_tensors(text_cfg, gen):
    """Random mtp.* tensors (bf16), fused experts, built from HF's own module classes."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer
    cfg = copy.deepcopy(text_cfg)
    cfg.num_hidden_layers = 1
    cfg.layer_types = ["full_attention"]
    H = cfg.hidden_size
    layer = Qwen3_5MoeDecoderLayer(cfg, 0)
    out = OrderedDict()
    out["mtp.fc.weight"] = random_value("mtp.fc.weight", (H, 2 * H), gen, norm_one_centred=True)
    for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
        out[n] = random_value(n, (H,), gen, norm_one_centred=True)
    for name, p in layer.named_parameters():
        out["mtp.layers.0." + name] = random_value("mtp.layers.0." + name, p.shape, gen, norm_one_centred=True)
    out["mtp.norm.weight"] = random_value("mtp.norm.weight", (H,), gen, norm_one_centred=True)
    return OrderedDict((k, v.to(torch.bfloat16)) for k, v in out.items())


def make_mtp_fn(model, mtp_sd, dev):
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm
    lm = model
    text_cfg = model.config.text_config
    rotary = model.model.language_model.rotary_emb
    return lambda hidden, prompt: mtp_reference(lm, mtp_sd, text_cfg, hidden, prompt, dev,
                                                Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm, rotary)


def fixture_qwen35(out, dev, prompts):
    from transformers import Qwen3_5MoeForConditionalGeneration
    d = os.path.join(out, "qwen35_moe")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    cfg = q35_configs()
    model = Qwen3_5MoeForConditionalGeneration(cfg).float()
    randomize_(model, gen, norm_one_centred=True)
    damp_eos_(model, tied=False)
    gen_sd = {k: v.clone() for k, v in model.state_dict().items()}
    mtp_sd = build_mtp_tensors(cfg.text_config, gen)
    model.generation_config.eos_token_id = EOS_ID
    model.to(torch.bfloat16)
    # save_original_format=False keeps the runtime (fused 3-D) expert layout; the default (True)
    # would split experts into per-expert 2-D tensors (HF 5.x reverse weight conversion).
    model.save_pretrained(d, max_shard_size=SHARD, save_original_format=False)
    add_shard_to_index(d, "mtp.safetensors", mtp_sd)
    del model

    ref = load_ref(Qwen3_5MoeForConditionalGeneration, d, dev)
    check_saved_equals(ref, gen_sd, "qwen35_moe")
    vision_smoke(ref, dev)
    hs_note = hidden_state_convention(ref, prompts[0], dev)
    mtp_fn = make_mtp_fn(ref, mtp_sd, dev)
    goldens, info = compute_goldens(ref, dev, base_model=ref.model, mtp=mtp_fn)
    meta = finish_fixture(d, "Qwen3_5MoeForConditionalGeneration", "fused", goldens, info,
                          {"hidden_states_note": hs_note})
    return d, meta, ref, mtp_sd, goldens


def vision_smoke(model, dev):
    """Run the tiny vision tower once (2x2 merged grid) to prove the vision_config is usable."""
    vc = model.config.vision_config
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    grid = torch.tensor([[1, 4, 4]], device=dev)
    px = torch.randn(16, patch_dim, generator=torch.Generator().manual_seed(7)).to(dev)
    with torch.no_grad():
        feats = model.model.get_image_features(px, grid, return_dict=True).pooler_output
    f = torch.cat(list(feats), 0) if isinstance(feats, (list, tuple)) else feats
    assert f.shape[-1] == model.config.text_config.hidden_size and torch.isfinite(f).all()


@torch.no_grad()
def hidden_state_convention(model, prompt, dev):
    out = model(input_ids=prompt[None].to(dev), output_hidden_states=True)
    hs = out.hidden_states
    base = model.model(input_ids=prompt[None].to(dev)).last_hidden_state
    last_is_post_norm = bool(torch.allclose(hs[-1], base, atol=1e-6))
    return (f"output_hidden_states returns {len(hs)} tensors (embeddings + one per decoder layer); "
            f"hidden_states[-1] is {'POST' if last_is_post_norm else 'PRE'}-final-norm. "
            "last_hidden_state (used for MTP goldens) is post-norm (= lm_head input).")
