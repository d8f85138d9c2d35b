"""Helpers of the FP8 fixtures (ModelOpt MIXED_PRECISION FP8 + NVFP4; Qwen block FP8). They are
derived from the saved qwen35_moe folder (weights and mtp.safetensors read back from disk), so they
can be made with --only without regenerating (or changing) any existing fixture."""

import os
import shutil
from collections import OrderedDict

import torch

from .bookkeeping import load_ref
from .fp8 import fp8_block_dequantize, fp8_cast, fp8_tensor_dequantize
from .nvfp4 import nvfp4_dequantize
from .st_io import read_dir_tensors

WRAP = "model.language_model.layers."
FP8_COUNTING_RULE = ("quantized_modules = number of *.weight_scale tensors plus number of *.weight_scale_inv "
                     "tensors (block FP8); unquantized_linear_modules = tensors named *.weight, dtype BF16, ndim "
                     "2, excluding embed_tokens and visual.pos_embed, plus BF16 3-D fused expert tensors; "
                     "k_scale / v_scale / input_scale are not modules.")


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


def start_derived_fixture(out, name, base_dir, dev):
    """A fixture derived from the bf16 qwen35_moe one: its folder made empty, the base's reference
    model, mtp.* and every tensor as written."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model, mtp_sd = load_qwen35_base(base_dir, dev)
    src, _ = read_dir_tensors(base_dir)
    return d, model, mtp_sd, src


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


def per_expert(sd, E, I, fn=None):
    """Tensors (mtp.*, or the main model's) with the fused experts split per expert (e -> gate_proj /
    up_proj / down_proj).
    fn(name, 2-D tensor) -> OrderedDict of tensors replacing `name` (default: keep)."""
    out = OrderedDict()
    fn = fn or (lambda n, v: OrderedDict([(n, v)]))
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(E):
                out.update(fn(f"{base}{e}.gate_proj.weight", v[e, :I].contiguous()))
                out.update(fn(f"{base}{e}.up_proj.weight", v[e, I:].contiguous()))
                out.update(fn(f"{base}{e}.down_proj.weight", sd[base + "down_proj"][e].contiguous()))
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
    used = {k: v.float() for k, v in per_expert(mtp_used, E, ref.config.text_config.moe_intermediate_size).items()} \
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
