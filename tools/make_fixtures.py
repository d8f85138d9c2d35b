#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints + golden outputs for Fathom's tests.

Usage:
    python tools/make_fixtures.py --out tests/fixtures [--device cuda|cpu]
    python tools/make_fixtures.py --out tests/fixtures --device cpu \
        --only qwen35_moe_fp8_mixed,qwen35_moe_fp8_mixed_w4a16_head,qwen35_moe_fp8_block
        (only the FP8 fixtures, derived from the already written OUT/qwen35_moe folder, or --base DIR;
         no other folder is touched)

Requires (pinned, no network needed): torch 2.11, transformers 5.17.0, safetensors 0.8, numpy.

Fixtures written (one folder each under --out):
  qwen35_moe/        Qwen3_5MoeForConditionalGeneration, bf16, sharded, FUSED experts
                     (save_pretrained(save_original_format=False)), tiny vision tower, untied
                     lm_head, plus one MTP layer in its own shard `mtp.safetensors`.
  qwen35_moe_nvfp4/  the same weights, routed + shared experts quantized to NVFP4 (ModelOpt
                     per-expert layout); everything else (incl. the whole mtp block, whose
                     experts are written per-expert BF16) stays BF16.
  qwen3_next/        Qwen3NextForCausalLM, bf16, sharded, per-expert tensors (what
                     save_pretrained writes), config.json without layer_types
                     (full_attention_interval: 4 instead).
  qwen3_dense/       Qwen3ForCausalLM, bf16, tied embeddings, single model.safetensors.
  qwen35_moe_fp8_mixed/  qwen35_moe's weights (read back from its folder) as ModelOpt MIXED_PRECISION
                     (nvidia/Qwen3.5-397B-A17B-NVFP4-V2 recipe): routed experts NVFP4 per expert, attention
                     q/k/v/o, GDN in_proj_qkv/in_proj_z/out_proj and the shared expert FP8 per tensor (W8A8,
                     static input_scale), k_scale/v_scale on the full-attention layer; MTP etc. BF16.
  qwen35_moe_fp8_mixed_w4a16_head/  the same plus a W4A16_NVFP4 lm_head (Qwen3.6-35B-A3B-NVFP4 variant).
  qwen35_moe_fp8_block/  qwen35_moe's weights as Qwen's block FP8 release (quant_method fp8, 128x128 blocks,
                     weight_scale_inv), routed experts and the MTP layer's linears per expert FP8 too.

Each folder has goldens.safetensors (F32/I32 only) and fathom_fixture.json.  All weights are
drawn on the CPU from fixed seeds, rounded to bf16, saved, and the reference model is re-loaded
from the SAVED files in float32 (eager attention, eager experts), so goldens see exactly the
on-disk bf16 values.  Goldens:
  prompt_{i}        I32 [T]        random ids in [2, vocab) (ids 0/1 are never used; 1 = eos);
                                   the prompt seed is picked among PROMPT_CANDIDATES seeds to
                                   maximise the minimum greedy margin (recorded as prompt_seed)
  logits_{i}        F32 [T, V]     teacher-forced logits (row t predicts token t+1)
  greedy_{i}        I32 [16]       greedy continuation, step by step with the KV/state cache
  greedy_margin_{i} F32 [16]       top1 - top2 logit at each greedy step
  greedy_logits_{i} F32 [16, V]    logits of each cached decode step (row s = logits after feeding
                                   prompt + greedy[:s]; row 0 = last prompt position), so a test can
                                   force the golden tokens and compare logits instead of argmaxes
  mtp_logits_{i}    F32 [T-1, V]   (Qwen3.5 fixtures) MTP logits, row t uses the main model's
                                   post-norm hidden state at position t and token prompt[t+1],
                                   all rows one causal sequence at positions 0..T-2.
  w8a8_logits_{i}   F32 [T, V]     (qwen35_moe_fp8_mixed*) teacher-forced logits with the FP8 linears'
                                   inputs quantized by their static input_scale (W8A8); see the fixture's
                                   fathom_fixture.json (goldens_semantics)
The quantized fixtures' goldens use the dequantized weights (weight-only semantics) unless said otherwise.
The eos row of lm_head (embedding row for the tied model) is scaled down so eos never wins a
greedy step: engines that stop on eos produce the same 16 tokens.
"""

import argparse
import copy
import glob
import json
import math
import os
import shutil
import sys
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

SEED = 20240611
PROMPT_LENGTHS = [5, 24, 80]
N_GREEDY = 16
PROMPT_CANDIDATES = 12
EOS_ID = 1
VOCAB = 512
SHARD = "200KB"

# --------------------------------------------------------------------------------------------
# Randomisation
# --------------------------------------------------------------------------------------------


def _normal(gen, shape, std, mean=0.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std + mean


def random_value(name, shape, gen, *, norm_one_centred, router_mult=4.0, lm_head_std_mult=3.0,
                 embed_std=1.0):
    """Value for one parameter, by name. norm_one_centred: norms are applied as (1 + w)."""
    shape = tuple(shape)
    n = name
    if n.endswith("A_log"):
        # A in [0.05, 2]: decay exp(-A*softplus(.)) spans ~0.25..0.97 per token
        u = torch.rand(*shape, generator=gen) * (2.0 - 0.05) + 0.05
        return torch.log(u)
    if n.endswith("dt_bias"):
        return _normal(gen, shape, 0.5)
    if n.endswith("conv1d.weight"):
        return _normal(gen, shape, 0.5)
    if n.endswith(".bias"):
        return _normal(gen, shape, 0.1)
    if ".visual." in n or n.startswith("visual."):
        if "norm" in n and len(shape) == 1:  # LayerNorm weight: plain w
            return 1.0 + _normal(gen, shape, 0.2)
        if n.endswith("pos_embed.weight"):
            return _normal(gen, shape, 0.5)
        fan_in = int(np.prod(shape[1:]))
        return _normal(gen, shape, 1.0 / math.sqrt(fan_in))
    if n.endswith("linear_attn.norm.weight"):  # gated RMSNorm: plain w in every model
        return 1.0 + _normal(gen, shape, 0.2)
    if len(shape) == 1 and "norm" in n:
        if norm_one_centred:
            return _normal(gen, shape, 0.2)
        return 1.0 + _normal(gen, shape, 0.2)
    if n.endswith("embed_tokens.weight"):
        return _normal(gen, shape, embed_std)
    if n.endswith("lm_head.weight"):
        return _normal(gen, shape, lm_head_std_mult / math.sqrt(shape[1]))
    if n.endswith("mlp.gate.weight"):  # MoE router: sharp
        return _normal(gen, shape, router_mult / math.sqrt(shape[1]))
    if n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
        return _normal(gen, shape, 1.0 / math.sqrt(shape[2]))
    if len(shape) == 2:
        return _normal(gen, shape, 1.0 / math.sqrt(shape[1]))
    raise ValueError(f"no randomisation rule for {name} {shape}")


@torch.no_grad()
def randomize_(module, gen, prefix="", **kw):
    for name, p in module.named_parameters():
        v = random_value(prefix + name, p.shape, gen, **kw)
        p.copy_(v.to(torch.bfloat16).to(p.dtype))  # round to bf16 values


@torch.no_grad()
def damp_eos_(model, tied):
    """Make eos (id 1) never the greedy argmax."""
    w = model.get_input_embeddings().weight if tied else model.get_output_embeddings().weight
    w[EOS_ID].mul_(0.05)
    w[EOS_ID].copy_(w[EOS_ID].to(torch.bfloat16).float())


# --------------------------------------------------------------------------------------------
# Safetensors helpers
# --------------------------------------------------------------------------------------------


def read_dir_tensors(d):
    """All tensors of a checkpoint dir, in index/file order. Returns OrderedDict and name->file."""
    out, where = OrderedDict(), {}
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    files = [f for f in files if os.path.basename(f) != "goldens.safetensors"]
    for f in files:
        with safe_open(f, "pt") as sf:
            for k in sf.keys():
                out[k] = sf.get_tensor(k)
                where[k] = os.path.basename(f)
    return out, where


def dtype_str(t):
    return {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.int32: "I32",
            torch.float8_e4m3fn: "F8_E4M3", torch.float16: "F16"}[t.dtype]


def nbytes(t):
    return t.numel() * t.element_size()


def write_sharded(d, shards, index_name="model.safetensors.index.json"):
    """shards: list of (filename, OrderedDict). Writes files + index with total_size."""
    weight_map, total = OrderedDict(), 0
    for fname, tensors in shards:
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, fname),
                  metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = fname
            total += nbytes(v)
    idx = {"metadata": {"total_size": total},
           "weight_map": OrderedDict(sorted(weight_map.items()))}
    with open(os.path.join(d, index_name), "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")


def pack_shards(tensors, max_bytes):
    shards, cur, cur_b = [], OrderedDict(), 0
    for k, v in tensors.items():
        b = nbytes(v)
        if cur and cur_b + b > max_bytes:
            shards.append(cur)
            cur, cur_b = OrderedDict(), 0
        cur[k] = v
        cur_b += b
    if cur:
        shards.append(cur)
    n = len(shards)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]


def add_shard_to_index(d, fname, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, fname),
              metadata={"format": "pt"})
    p = os.path.join(d, "model.safetensors.index.json")
    idx = json.load(open(p))
    for k, v in tensors.items():
        idx["weight_map"][k] = fname
        idx["metadata"]["total_size"] = int(idx["metadata"].get("total_size", 0)) + nbytes(v)
        if "total_parameters" in idx["metadata"]:
            idx["metadata"]["total_parameters"] = int(idx["metadata"]["total_parameters"]) + v.numel()
    idx["weight_map"] = OrderedDict(sorted(idx["weight_map"].items()))
    with open(p, "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")


def edit_json(path, fn):
    cfg = json.load(open(path))
    cfg = fn(cfg) or cfg
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------------------------
# NVFP4 (ModelOpt) quantisation
# --------------------------------------------------------------------------------------------

E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def cast_fp4(x):
    """ModelOpt _cast_fp4: nearest, ties at bounds with odd index (0.75,1.75,3.5) round up,
    at even index (0.25,1.25,2.5,5) round down (= round-half-to-even code)."""
    mask = torch.tensor([0, 1, 0, 1, 0, 1, 0], dtype=torch.uint8)
    sign = (x < 0).to(torch.uint8)
    a = x.abs()
    ordv = torch.searchsorted(E2M1_BOUNDS, a.contiguous(), out_int32=True).to(torch.uint8)
    rnd = torch.any((a.unsqueeze(-1) == E2M1_BOUNDS) * mask, dim=-1).to(torch.uint8)
    return (sign * 8 + ordv + rnd).to(torch.uint8)


def nvfp4_quantize(w, scale_2=None):
    """w fp32 [N, K]. Returns packed u8 [N,K/2], scale e4m3 [N,K/16], scale_2 fp32 []."""
    w = w.float().cpu()
    n, k = w.shape
    assert k % 16 == 0
    if scale_2 is None:
        scale_2 = w.abs().amax() / (6.0 * 448.0)
    scale_2 = scale_2.float().reshape(())
    blk = w.reshape(n, k // 16, 16)
    per_block_amax = blk.abs().amax(-1)
    per_block_scale = per_block_amax / 6.0
    q = per_block_scale / scale_2
    q[per_block_scale == 0] = 1.0
    q = q.clamp(2.0 ** -9, 448.0).to(torch.float8_e4m3fn)
    scaled = blk / (q.float() * scale_2).unsqueeze(-1)
    codes = cast_fp4(scaled.reshape(n, k))
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed.contiguous(), q.contiguous(), scale_2.clone()


def nvfp4_dequantize(packed, scale, scale_2):
    n, kh = packed.shape
    k = kh * 2
    codes = torch.empty(n, k, dtype=torch.long)
    codes[:, 0::2] = (packed & 0xF).long()
    codes[:, 1::2] = (packed >> 4).long()
    vals = E2M1_VALUES[codes].reshape(n, k // 16, 16)
    return (vals * (scale.float() * scale_2.float()).unsqueeze(-1)).reshape(n, k)


# --------------------------------------------------------------------------------------------
# Goldens
# --------------------------------------------------------------------------------------------


def make_prompts(seed):
    rs = np.random.RandomState(seed)
    return [torch.tensor(rs.randint(2, VOCAB, size=T), dtype=torch.long) for T in PROMPT_LENGTHS]


def top2_margin(logits_row):
    t = torch.topk(logits_row.float(), 2)
    return float(t.values[0] - t.values[1])


@torch.no_grad()
def greedy(model, prompt, dev):
    ids = prompt[None].to(dev)
    out = model(input_ids=ids, use_cache=True)
    past = out.past_key_values
    last = out.logits[0, -1].float()
    toks, margins, step_logits = [], [], []
    for _ in range(N_GREEDY):
        tok = int(torch.argmax(last))
        toks.append(tok)
        margins.append(top2_margin(last))
        step_logits.append(last.cpu())
        out = model(input_ids=torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
        past = out.past_key_values
        last = out.logits[0, -1].float()
    return toks, margins, torch.stack(step_logits)


@torch.no_grad()
def mtp_reference(lm, mtp_sd, text_cfg, hidden, prompt, dev, layer_cls, norm_cls, rotary):
    """MTP logits from transformers' own modules. hidden: [T, H] post-norm main-model hidden."""
    cfg = copy.deepcopy(text_cfg)
    cfg.num_hidden_layers = 1
    cfg.layer_types = ["full_attention"]
    H = cfg.hidden_size
    layer = layer_cls(cfg, 0).float().to(dev).eval()
    lsd = {k[len("mtp.layers.0."):]: v.float() for k, v in mtp_sd.items() if k.startswith("mtp.layers.0.")}
    # per-expert BF16 form -> fused container
    if any(".experts.0." in k for k in lsd):
        E = cfg.num_experts
        gu = torch.stack([torch.cat([lsd.pop(f"mlp.experts.{e}.gate_proj.weight"),
                                     lsd.pop(f"mlp.experts.{e}.up_proj.weight")], 0) for e in range(E)])
        dn = torch.stack([lsd.pop(f"mlp.experts.{e}.down_proj.weight") for e in range(E)])
        lsd["mlp.experts.gate_up_proj"], lsd["mlp.experts.down_proj"] = gu, dn
    layer.load_state_dict(lsd, strict=True)
    norm_e = norm_cls(H, eps=cfg.rms_norm_eps).float().to(dev)
    norm_h = norm_cls(H, eps=cfg.rms_norm_eps).float().to(dev)
    norm_o = norm_cls(H, eps=cfg.rms_norm_eps).float().to(dev)
    norm_e.weight.copy_(mtp_sd["mtp.pre_fc_norm_embedding.weight"].float())
    norm_h.weight.copy_(mtp_sd["mtp.pre_fc_norm_hidden.weight"].float())
    norm_o.weight.copy_(mtp_sd["mtp.norm.weight"].float())
    fc = nn.Linear(2 * H, H, bias=False).float().to(dev)
    fc.weight.copy_(mtp_sd["mtp.fc.weight"].float())

    T = prompt.shape[0]
    n = T - 1
    e = lm.get_input_embeddings()(prompt[1:].to(dev)[None]).float()  # [1, n, H]
    h = hidden[:n].to(dev)[None].float()
    u = fc(torch.cat([norm_e(e), norm_h(h)], dim=-1))  # embedding FIRST
    pos = torch.arange(n, device=dev).view(1, 1, -1).expand(3, 1, -1)
    cos_sin = rotary(u, pos)
    mask = torch.full((n, n), float("-inf"), device=dev).triu(1)[None, None]
    v = layer(u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos[0])
    if isinstance(v, tuple):
        v = v[0]
    logits = lm.get_output_embeddings()(norm_o(v))
    # cross-check the explicit mask / rotary handling: the same layer + mtp.norm run as a 1-layer
    # Qwen3_5MoeTextModel on inputs_embeds=u (HF builds positions and the causal mask itself)
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTextModel
    tm = Qwen3_5MoeTextModel(cfg).float().to(dev).eval()
    tm.layers[0].load_state_dict(layer.state_dict(), strict=True)
    tm.norm.weight.copy_(norm_o.weight)
    alt = lm.get_output_embeddings()(tm(inputs_embeds=u).last_hidden_state)
    diff = float((alt - logits).abs().max())
    assert diff < 1e-4, f"MTP cross-check failed ({diff})"
    return logits[0].float().cpu()


@torch.no_grad()
def choose_prompts(model, dev, n_candidates=PROMPT_CANDIDATES):
    """Deterministically pick, among n_candidates prompt seeds, the prompt set whose greedy
    continuations have the largest minimum top1-top2 margin (fewer near-ties for engines)."""
    best = None
    for j in range(n_candidates):
        seed = SEED + 1000 * j
        prompts = make_prompts(seed)
        m = min(min(greedy(model, p, dev)[1]) for p in prompts)
        if best is None or m > best[0]:
            best = (m, seed, prompts)
    return best[1], best[2]


@torch.no_grad()
def compute_goldens(model, dev, *, base_model=None, mtp=None):
    """base_model: the module returning last_hidden_state (post-norm)."""
    prompt_seed, prompts = choose_prompts(model, dev)
    g, info = OrderedDict(), {"margins": [], "cache_vs_full_maxdiff": 0.0, "argmax_mismatch": 0,
                              "eos_in_greedy": False, "prompt_seed": prompt_seed}
    for i, p in enumerate(prompts):
        out = model(input_ids=p[None].to(dev))
        logits = out.logits[0].float().cpu()
        g[f"prompt_{i}"] = p.to(torch.int32)
        g[f"logits_{i}"] = logits
        toks, margins, step_logits = greedy(model, p, dev)
        g[f"greedy_{i}"] = torch.tensor(toks, dtype=torch.int32)
        g[f"greedy_margin_{i}"] = torch.tensor(margins, dtype=torch.float32)
        g[f"greedy_logits_{i}"] = step_logits.float()
        info["margins"] += margins
        info["eos_in_greedy"] |= EOS_ID in toks
        # consistency: cached decode vs. one teacher-forced pass over prompt + greedy
        full = torch.cat([p, torch.tensor(toks[:-1])])
        fl = model(input_ids=full[None].to(dev)).logits[0, len(p) - 1:].float().cpu()
        info["cache_vs_full_maxdiff"] = max(info["cache_vs_full_maxdiff"], float((fl - step_logits).abs().max()))
        info["argmax_mismatch"] += int((fl.argmax(-1) != torch.tensor(toks)).sum())
        if mtp is not None:
            bo = base_model(input_ids=p[None].to(dev))
            hidden = bo.last_hidden_state[0].float()
            # last_hidden_state must be post-norm: lm_head(h) == logits
            chk = float((model.get_output_embeddings()(hidden).cpu() - logits).abs().max())
            assert chk < 1e-4, f"last_hidden_state is not the lm_head input ({chk})"
            g[f"mtp_logits_{i}"] = mtp(hidden, p)
    assert not info["eos_in_greedy"]
    return g, info


# --------------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------------

COUNTING_RULE = ("unquantized_linear_modules = tensors named *.weight, dtype BF16, ndim 2, excluding "
                 "embed_tokens and visual.pos_embed (embeddings), plus each BF16 3-D fused expert tensor "
                 "(experts.gate_up_proj / experts.down_proj) counted once; conv weights (conv1d 3-D, "
                 "patch_embed 5-D), norms, biases, A_log, dt_bias are not counted. quantized_modules = "
                 "number of *.weight_scale tensors.")


def tensor_stats(d):
    t, _ = read_dir_tensors(d)
    q = sum(1 for k in t if k.endswith(".weight_scale"))
    unq = 0
    for k, v in t.items():
        if v.dtype != torch.bfloat16:
            continue
        if k.endswith(".weight") and v.ndim == 2 and "embed_tokens" not in k and "pos_embed" not in k:
            unq += 1
        elif v.ndim == 3 and (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")):
            unq += 1
    return {
        "quantized_modules": q,
        "unquantized_linear_modules": unq,
        "mtp_tensors": sum(1 for k in t if k.startswith("mtp.")),
        "vision_tensors": sum(1 for k in t if k.startswith("model.visual.")),
        "total_tensors": len(t),
    }, t


def finish_fixture(d, arch, experts_layout, goldens, info, extra=None):
    save_file({k: v.contiguous() for k, v in goldens.items()}, os.path.join(d, "goldens.safetensors"),
              metadata={"format": "pt"})
    stats, _ = tensor_stats(d)
    margins = info["margins"]
    meta = OrderedDict(
        architecture=arch,
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        seed=SEED,
        prompt_lengths=PROMPT_LENGTHS,
        n_greedy=N_GREEDY,
        eos_token_id=EOS_ID,
        experts_layout=experts_layout,
        **stats,
        logits_spread=float(goldens["logits_0"].max() - goldens["logits_0"].min()),
        min_greedy_margin=float(min(margins)),
        median_greedy_margin=float(np.median(margins)),
        max_abs_logit=float(max(goldens[k].abs().max() for k in goldens if k.startswith("logits_"))),
        prompt_seed=info["prompt_seed"],
        cache_vs_full_logits_maxdiff=info["cache_vs_full_maxdiff"],
        cache_vs_full_argmax_mismatches=info["argmax_mismatch"],
        eos_in_greedy=info["eos_in_greedy"],
        counting_rule=COUNTING_RULE,
    )
    if extra:
        meta.update(extra)
    with open(os.path.join(d, "fathom_fixture.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    for f in glob.glob(os.path.join(d, "*")):
        os.chmod(f, 0o644)
    return meta


def load_ref(cls, d, dev):
    model, info = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                      experts_implementation="eager", output_loading_info=True)
    print(f"  load info {os.path.basename(d)}: " + ", ".join(f"{k}={sorted(v) if v else []}" for k, v in info.items()))
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        bad = [x for x in (info.get(k) or []) if not str(x).startswith("mtp.")]
        assert not bad, f"{k}: {bad}"
    return model.to(dev).eval()


def check_saved_equals(model, ref_sd, what):
    sd = model.state_dict()
    worst = 0.0
    for k, v in ref_sd.items():
        if k not in sd:
            continue
        worst = max(worst, float((sd[k].float().cpu() - v.float()).abs().max()))
    assert worst == 0.0, f"{what}: reloaded params differ from generated ones ({worst})"


# --------------------------------------------------------------------------------------------
# Fixture builders
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# FP8 fixtures (ModelOpt MIXED_PRECISION FP8 + NVFP4; Qwen block FP8). Derived from the saved
# qwen35_moe folder (weights and mtp.safetensors read back from disk), so they can be made with
# --only without regenerating (or changing) any existing fixture.
# --------------------------------------------------------------------------------------------

FP8_MAX = 448.0
FP8_BLOCK = 128
WRAP = "model.language_model.layers."
FP8_COUNTING_RULE = ("quantized_modules = number of *.weight_scale tensors plus number of *.weight_scale_inv "
                     "tensors (block FP8); unquantized_linear_modules = tensors named *.weight, dtype BF16, ndim "
                     "2, excluding embed_tokens and visual.pos_embed, plus BF16 3-D fused expert tensors; "
                     "k_scale / v_scale / input_scale are not modules.")


def fp8_cast(x):
    """fp32 -> float8_e4m3fn: clamp to +-448, then torch's cast (round to nearest even)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_tensor_quantize(w):
    """Per-tensor FP8 (ModelOpt FP8): scale = amax/448 (fp32), q = e4m3(w / scale) (fp32 division)."""
    w = w.float().cpu()
    amax = w.abs().amax()
    scale = amax / FP8_MAX if float(amax) > 0 else torch.tensor(1.0)
    scale = scale.float().reshape(())
    return fp8_cast(w / scale).contiguous(), scale.clone()


def fp8_tensor_dequantize(q, scale):
    return q.float() * scale.float()


def _block_expand(s, n, k, b=FP8_BLOCK):
    return s.float().repeat_interleave(b, 0).repeat_interleave(b, 1)[:n, :k]


def fp8_block_quantize(w, b=FP8_BLOCK):
    """Block FP8 (Qwen -FP8 / DeepSeek style): per [128, 128] block (partial at the edges)
    weight_scale_inv = block amax / 448 (1.0 for an all-zero block), q = e4m3(w / block scale)."""
    w = w.float().cpu()
    n, k = w.shape
    nb, kb = -(-n // b), -(-k // b)
    pad = torch.zeros(nb * b, kb * b)
    pad[:n, :k] = w
    amax = pad.reshape(nb, b, kb, b).abs().amax(dim=(1, 3))
    s = amax / FP8_MAX
    s[amax == 0] = 1.0
    return fp8_cast(w / _block_expand(s, n, k, b)).contiguous(), s.float().contiguous()


def fp8_block_dequantize(q, s, b=FP8_BLOCK):
    n, k = q.shape
    return q.float() * _block_expand(s, n, k, b)


def q35_fp8_modules(tc, prefix=WRAP):
    """The linears the V2 recipe makes FP8 (per tensor): attention q/k/v/o, GDN in_proj_qkv,
    in_proj_z, out_proj, and the shared expert's gate/up/down."""
    mods = []
    for L, t in enumerate(tc.layer_types):
        if t == "full_attention":
            mods += [f"{prefix}{L}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        else:
            mods += [f"{prefix}{L}.linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "out_proj")]
        mods += [f"{prefix}{L}.mlp.shared_expert.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
    return mods


def load_qwen35_base(base_dir, dev):
    """The bf16 qwen35_moe fixture as written: fp32 reference model + its mtp.* tensors (fused experts)."""
    from transformers import Qwen3_5MoeForConditionalGeneration
    model = load_ref(Qwen3_5MoeForConditionalGeneration, base_dir, dev)
    t, _ = read_dir_tensors(base_dir)
    mtp_sd = OrderedDict((k, v) for k, v in t.items() if k.startswith("mtp."))
    assert mtp_sd and all(v.dtype == torch.bfloat16 for v in mtp_sd.values())
    return model, mtp_sd


@torch.no_grad()
def calibrate_qwen35(base_model, prompts, dev, fp8_modules):
    """ModelOpt-style max calibration on the unquantized (bf16-valued, fp32) model:
    - moe_in / inter: amax of the MoE block input and of the routed experts' intermediate
      (silu(gate) * up), every expert on every token (as fixture_qwen35_nvfp4 does);
    - inputs[m]: amax of the INPUT activation of each FP8 linear m (forward pre-hooks);
    - k[L]: amax of the post-RoPE, post-k_norm keys of full-attention layer L (wrapping
      apply_rotary_pos_emb), v[L]: amax of v_proj's output (values get neither norm nor RoPE)."""
    import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as mq
    I = base_model.config.text_config.moe_intermediate_size
    amax = {"moe_in": {}, "inter": {}, "inputs": {}, "k": {}, "v": {}}

    def upd(tab, key, x):
        tab[key] = max(tab.get(key, 0.0), float(x.detach().float().abs().max()))

    hooks, named = [], dict(base_model.named_modules())
    for L, layer in enumerate(base_model.model.language_model.layers):
        def moe_hook(mod, args, L=L):
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            upd(amax["moe_in"], L, x)
            gu = torch.einsum("th,eoh->eto", x, mod.experts.gate_up_proj.float())
            upd(amax["inter"], L, torch.nn.functional.silu(gu[..., :I]) * gu[..., I:])
        hooks.append(layer.mlp.register_forward_pre_hook(moe_hook))
        if hasattr(layer, "self_attn"):
            hooks.append(layer.self_attn.register_forward_pre_hook(lambda m, a, L=L: amax.__setitem__("cur", L)))
            hooks.append(layer.self_attn.v_proj.register_forward_hook(lambda m, a, o, L=L: upd(amax["v"], L, o)))
    for name in fp8_modules:
        hooks.append(named[name].register_forward_pre_hook(lambda m, a, name=name: upd(amax["inputs"], name, a[0])))
    orig_rope = mq.apply_rotary_pos_emb

    def rope_hook(q, k, cos, sin, *a, **kw):
        qo, ko = orig_rope(q, k, cos, sin, *a, **kw)
        upd(amax["k"], amax["cur"], ko)
        return qo, ko
    mq.apply_rotary_pos_emb = rope_hook
    try:
        for p in prompts:
            base_model(input_ids=p[None].to(dev))
    finally:
        mq.apply_rotary_pos_emb = orig_rope
        for h in hooks:
            h.remove()
    amax.pop("cur", None)
    assert set(amax["inputs"]) == set(fp8_modules)
    assert set(amax["k"]) == set(amax["v"]) == {L for L, t in enumerate(base_model.config.text_config.layer_types)
                                                  if t == "full_attention"}
    return amax


def mtp_per_expert(mtp_sd, E, I, fn=None):
    """mtp.* with the fused experts split per expert (e -> gate_proj/up_proj/down_proj).
    fn(name, 2-D tensor) -> OrderedDict of tensors replacing `name` (default: keep)."""
    out = OrderedDict()
    fn = fn or (lambda n, v: OrderedDict([(n, v)]))
    for k, v in mtp_sd.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(E):
                out.update(fn(f"{base}{e}.gate_proj.weight", v[e, :I].contiguous()))
                out.update(fn(f"{base}{e}.up_proj.weight", v[e, I:].contiguous()))
                out.update(fn(f"{base}{e}.down_proj.weight", mtp_sd[base + "down_proj"][e].contiguous()))
        elif k.endswith("experts.down_proj"):
            continue
        else:
            out.update(fn(k, v))
    return out


def dequantize_dir(d, E, fuse=True):
    """Every tensor of a written checkpoint dequantized to fp32 from the files alone (the format of
    each module decided by the tensors present), the main model's per-expert tensors fused back
    into HF's experts.gate_up_proj / experts.down_proj. Returns (main, mtp) dicts; scale tensors,
    k_scale / v_scale and input_scale are dropped."""
    t, _ = read_dir_tensors(d)
    deq = OrderedDict()
    for k, v in t.items():
        if k.endswith((".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale", ".k_scale",
                       ".v_scale")):
            continue
        if k.endswith(".weight") and k + "_scale_inv" in t:
            assert v.dtype == torch.float8_e4m3fn
            deq[k] = fp8_block_dequantize(v, t[k + "_scale_inv"])
        elif k.endswith(".weight") and k + "_scale_2" in t:
            assert v.dtype == torch.uint8
            deq[k] = nvfp4_dequantize(v, t[k + "_scale"], t[k + "_scale_2"])
        elif k.endswith(".weight") and k + "_scale" in t:
            assert v.dtype == torch.float8_e4m3fn and t[k + "_scale"].shape == ()
            deq[k] = fp8_tensor_dequantize(v, t[k + "_scale"])
        else:
            assert v.dtype == torch.bfloat16, k
            deq[k] = v.float()
    main = OrderedDict((k, v) for k, v in deq.items() if not k.startswith("mtp."))
    mtp = OrderedDict((k, v) for k, v in deq.items() if k.startswith("mtp."))
    if not fuse:
        return main, mtp
    for k in [k for k in main if k.endswith(".experts.0.gate_proj.weight")]:
        base = k[: -len("0.gate_proj.weight")]
        main[base + "gate_up_proj"] = torch.stack([torch.cat([main.pop(f"{base}{e}.gate_proj.weight"),
                                                              main.pop(f"{base}{e}.up_proj.weight")], 0)
                                                   for e in range(E)])
        main[base + "down_proj"] = torch.stack([main.pop(f"{base}{e}.down_proj.weight") for e in range(E)])
    return main, mtp


def check_goldens_weights(d, ref, mtp_used, E):
    """The weights the goldens were computed with (ref's parameters, the MTP tensors handed to
    mtp_reference) must equal, bit for bit, what dequantizing the written files gives."""
    main, mtp = dequantize_dir(d, E)
    sd = {k: v.float().cpu() for k, v in ref.state_dict().items()}
    assert set(main) == set(sd), (set(main) ^ set(sd))
    bad = [k for k in sd if not torch.equal(sd[k], main[k])]
    assert not bad, f"{d}: goldens weights differ from the written files: {bad[:5]}"
    used = {k: v.float() for k, v in mtp_per_expert(mtp_used, E, ref.config.text_config.moe_intermediate_size).items()} \
        if any(k.endswith("gate_up_proj") for k in mtp_used) else {k: v.float() for k, v in mtp_used.items()}
    assert set(used) == set(mtp), (set(used) ^ set(mtp))
    bad = [k for k in used if not torch.equal(used[k], mtp[k])]
    assert not bad, f"{d}: MTP goldens weights differ from the written files: {bad[:5]}"
    return len(sd) + len(used)


@torch.no_grad()
def load_weights_(model, weights):
    """Copy fp32 weights (HF state-dict names, fused experts) into model."""
    sd = model.state_dict()
    for k, v in weights.items():
        sd[k].copy_(v.to(sd[k].device))


def rel_err(w, orig):
    return float((w - orig).norm() / orig.norm())


@torch.no_grad()
def w8a8_teacher_forced(model, fp8_scales, prompts, dev, reciprocal=False):
    """Teacher-forced logits with every FP8 linear's input quantized by its static input_scale:
    x_q = fp32(e4m3(clamp(x / s, -448, 448))) * s (fp32 x, fp32 true division, RNE cast), then
    F.linear(x_q, W_dequant). Everything else (NVFP4 experts, KV cache) as in the goldens.
    reciprocal=True: x * fp32(1 / s) instead of x / s (what engines holding input_scale_inv do),
    only to measure how much such an implementation detail moves the logits."""
    named = dict(model.named_modules())
    for name, s in fp8_scales.items():
        mod = named[name]
        s = s.float().to(dev)

        def fwd(x, mod=mod, s=s):
            xs = x.float() * (1.0 / s) if reciprocal else x.float() / s
            xq = fp8_cast(xs).float() * s
            return torch.nn.functional.linear(xq, mod.weight, mod.bias)
        mod.forward = fwd
    try:
        return [model(input_ids=p[None].long().to(dev)).logits[0].float().cpu() for p in prompts]
    finally:
        for name in fp8_scales:
            del named[name].forward


@torch.no_grad()
def logit_gap(a_list, b_list):
    """max over prompts of max|a - b| / spread(b)."""
    return max(float((a - b).abs().max() / (b.max() - b.min())) for a, b in zip(a_list, b_list))


def fixture_qwen35_fp8_mixed(out, dev, prompts, base_dir, name="qwen35_moe_fp8_mixed", w4a16_head=False):
    """ModelOpt MIXED_PRECISION (nvidia/Qwen3.5-397B-A17B-NVFP4-V2 recipe): routed experts NVFP4 per
    expert, attention / GDN qkv,z,out / shared expert FP8 per tensor (W8A8, static input scale),
    FP8 KV cache scales on the full-attention layers; with w4a16_head the lm_head is W4A16 NVFP4
    (the Qwen3.6-35B-A3B-NVFP4 variant)."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    base_model, mtp_sd = load_qwen35_base(base_dir, dev)
    tc = base_model.config.text_config
    E, I = tc.num_experts, tc.moe_intermediate_size
    src, _ = read_dir_tensors(base_dir)
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
    mtp_dst = mtp_per_expert(mtp_sd, E, I)  # MTP: BF16, experts per expert (as the nvfp4 fixture)
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


def fixture_qwen35_fp8_block(out, dev, prompts, base_dir, name="qwen35_moe_fp8_block"):
    """Qwen's own FP8 releases (quant_method fp8, 128x128 blocks, weight_scale_inv)."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model, mtp_sd = load_qwen35_base(base_dir, dev)
    tc = model.config.text_config
    E, I = tc.num_experts, tc.moe_intermediate_size
    src, _ = read_dir_tensors(base_dir)
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

    dst = OrderedDict()
    for k, v in src.items():
        if k.startswith("mtp."):
            continue
        if k.endswith("experts.gate_up_proj"):
            lp = k[: -len("gate_up_proj")]
            for e in range(E):
                dst.update(conv(f"{lp}{e}.gate_proj.weight", v[e, :I].contiguous()))
                dst.update(conv(f"{lp}{e}.up_proj.weight", v[e, I:].contiguous()))
                dst.update(conv(f"{lp}{e}.down_proj.weight", src[lp + "down_proj"][e].contiguous()))
        elif k.endswith("experts.down_proj"):
            pass
        else:
            dst.update(conv(k, v))
    mtp_dst = mtp_per_expert(mtp_sd, E, I, conv)
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


NEW_FIXTURES = OrderedDict([
    ("qwen35_moe_fp8_mixed", lambda out, dev, prompts, base: fixture_qwen35_fp8_mixed(out, dev, prompts, base)),
    ("qwen35_moe_fp8_mixed_w4a16_head", lambda out, dev, prompts, base: fixture_qwen35_fp8_mixed(
        out, dev, prompts, base, name="qwen35_moe_fp8_mixed_w4a16_head", w4a16_head=True)),
    ("qwen35_moe_fp8_block", lambda out, dev, prompts, base: fixture_qwen35_fp8_block(out, dev, prompts, base)),
])


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


# --------------------------------------------------------------------------------------------


def reverify(d, cls, dev, prompts, mtp=False):
    """Reload a bf16 fixture and re-check logits against the goldens file."""
    ref = load_ref(cls, d, dev)
    g, _ = read_goldens(d)
    worst = 0.0
    with torch.no_grad():
        for i, _ in enumerate(prompts):
            p = g[f"prompt_{i}"].long()
            lg = ref(input_ids=p[None].to(dev)).logits[0].float().cpu()
            worst = max(worst, float((lg - g[f"logits_{i}"]).abs().max()))
    assert worst < 1e-3, f"{d}: reloaded logits differ from goldens by {worst}"
    return worst


def read_goldens(d):
    out = OrderedDict()
    with safe_open(os.path.join(d, "goldens.safetensors"), "pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out, None


def describe(d, limit_layer=("layers.0.", "layers.3.")):
    t, where = read_dir_tensors(d)
    lines = []
    for k, v in t.items():
        if ".layers." in k and not any(s in k for s in limit_layer) and not k.startswith("mtp."):
            continue
        if ".experts." in k and any(f".experts.{e}." in k for e in range(1, 64)):
            continue
        lines.append(f"    {k:78s} {dtype_str(v):8s} {list(v.shape)}  [{where[k]}]")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--list-tensors", action="store_true", help="print tensor names/shapes of layers 0 and 3")
    ap.add_argument("--only", default=None,
                    help="comma-separated subset of the fixtures derived from an already written qwen35_moe folder ("
                         + ", ".join(NEW_FIXTURES) + "); nothing else is (re)written")
    ap.add_argument("--base", default=None, help="with --only: the qwen35_moe folder to derive from "
                                                 "(default: OUT/qwen35_moe)")
    args = ap.parse_args()
    t0 = time.time()
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}")
    prompts = make_prompts(SEED)

    from transformers import Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM, Qwen3ForCausalLM
    results = []
    if args.only:
        names = [n for n in args.only.split(",") if n]
        unknown = [n for n in names if n not in NEW_FIXTURES]
        if unknown:
            ap.error(f"--only: unknown {unknown} (choices: {', '.join(NEW_FIXTURES)})")
        base = args.base or os.path.join(args.out, "qwen35_moe")
        for i, n in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {n} (from {base})")
            results.append(NEW_FIXTURES[n](args.out, dev, prompts, base))
        print_summary(results, args, t0)
        return
    print("[1/7] qwen35_moe")
    d1, m1, ref1, mtp_sd, _ = fixture_qwen35(args.out, dev, prompts)
    results.append((d1, m1))
    print("[2/7] qwen35_moe_nvfp4")
    d2, m2 = fixture_qwen35_nvfp4(args.out, dev, prompts, d1, ref1, mtp_sd)
    results.append((d2, m2))
    del ref1
    print("[3/7] qwen3_next")
    results.append(fixture_qwen3_next(args.out, dev, prompts))
    print("[4/7] qwen3_dense")
    results.append(fixture_qwen3_dense(args.out, dev, prompts))
    # derived from the qwen35_moe folder as written (the same path as --only)
    for i, n in enumerate(NEW_FIXTURES):
        print(f"[{5 + i}/7] {n}")
        results.append(NEW_FIXTURES[n](args.out, dev, prompts, d1))

    print("re-verifying bf16 fixtures from disk ...")
    for d, cls in ((d1, Qwen3_5MoeForConditionalGeneration), (results[2][0], Qwen3NextForCausalLM),
                   (results[3][0], Qwen3ForCausalLM)):
        w = reverify(d, cls, dev, prompts)
        print(f"  {os.path.basename(d)}: max |logits - golden| = {w:.3g}")

    print_summary(results, args, t0)


def print_summary(results, args, t0):
    if args.list_tensors:
        for d, _ in results:
            print(f"\n== {os.path.basename(d)}\n" + describe(d))

    print()
    hdr = f"{'fixture':32s} {'files':>5s} {'bytes':>9s} {'min_margin':>10s} {'med_margin':>10s} {'max|logit|':>10s} {'spread0':>8s}"
    print(hdr)
    print("-" * len(hdr))
    total = 0
    for d, m in results:
        files = sorted(os.listdir(d))
        b = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        total += b
        print(f"{os.path.basename(d):32s} {len(files):5d} {b:9d} {m['min_greedy_margin']:10.4f} "
              f"{m['median_greedy_margin']:10.4f} {m['max_abs_logit']:10.3f} {m['logits_spread']:8.3f}")
    print(f"{'TOTAL':32s} {'':5s} {total:9d}")
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
