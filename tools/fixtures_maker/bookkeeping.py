"""Bookkeeping: tensor counts, goldens.safetensors + fathom_fixture.json, the reference model."""

import glob
import json
import os
from collections import OrderedDict

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

from .common import EOS_ID, N_GREEDY, PROMPT_LENGTHS, SEED
from .st_io import read_dir_tensors

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
