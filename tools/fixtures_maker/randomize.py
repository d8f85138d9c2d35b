"""Random parameter values, chosen by parameter name, rounded to bf16."""

import math

import numpy as np
import torch

from .common import EOS_ID


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
