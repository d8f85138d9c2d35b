#!/usr/bin/env python3
"""Goldens for the embedded default model (issue 16), from transformers on its saved weights, in
the format of tools/make_fixtures.py (goldens.safetensors: prompt_i, logits_i, greedy_i,
greedy_margin_i, mtp_logits_i), so tests/model/test_fixture_goldens.cpp checks Fathom's CPU
engine on it like the other fixtures. The prompts are held-out English text.

usage: tools/make_default_goldens.py MODEL_DIR HELDOUT_TXT [--device cuda]
Needs torch, transformers (Qwen3_5Moe classes), tokenizers, safetensors.
"""
import argparse
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (the fixtures' reference MTP and helpers)

SEPARATOR = "\n\f\n"
PROMPT_TOKENS = (7, 19, 33)
GREEDY_TOKENS = 24


@torch.no_grad()
def greedy(model, prompt, dev, n):
    ids = prompt[None].to(dev)
    out = model(input_ids=ids, use_cache=True)
    past, last = out.past_key_values, out.logits[0, -1].float()
    toks, margins = [], []
    for _ in range(n):
        tok = int(torch.argmax(last))
        toks.append(tok)
        margins.append(mf.top2_margin(last))
        out = model(input_ids=torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
        past, last = out.past_key_values, out.logits[0, -1].float()
    return toks, margins


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("heldout")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from transformers import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm
    dev = torch.device(a.device)
    model = mf.load_ref(Qwen3_5MoeForCausalLM, a.model, dev)
    mtp_sd = {}
    with safe_open(os.path.join(a.model, "mtp.safetensors"), "pt") as f:
        for k in f.keys():
            mtp_sd[k] = f.get_tensor(k)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    docs = [d for d in open(a.heldout, encoding="utf-8").read().split(SEPARATOR) if len(d) > 400]
    g = {}
    for i, n in enumerate(PROMPT_TOKENS):
        doc = docs[(i * 7919) % len(docs)]
        p = torch.tensor(tok.encode(doc, add_special_tokens=False).ids[:n])
        out = model(input_ids=p[None].to(dev))
        logits = out.logits[0].float().cpu()
        toks, margins = greedy(model, p, dev, GREEDY_TOKENS)
        hidden = model.model(input_ids=p[None].to(dev)).last_hidden_state[0].float()
        chk = float((model.lm_head(hidden).cpu() - logits).abs().max())
        assert chk < 1e-4, f"last_hidden_state is not the lm_head input ({chk})"
        mtp = mf.mtp_reference(model, mtp_sd, model.config, hidden, p, dev, Qwen3_5MoeDecoderLayer,
                               Qwen3_5MoeRMSNorm, model.model.rotary_emb)
        g[f"prompt_{i}"] = p.to(torch.int32)
        g[f"logits_{i}"] = logits
        g[f"greedy_{i}"] = torch.tensor(toks, dtype=torch.int32)
        g[f"greedy_margin_{i}"] = torch.tensor(margins, dtype=torch.float32)
        g[f"mtp_logits_{i}"] = mtp.float().cpu()
        print(f"prompt {i}: {tok.decode(p.tolist())!r} -> {tok.decode(toks)!r} (min margin {min(margins):.3f})")
    save_file({k: v.contiguous() for k, v in g.items()}, os.path.join(a.model, "goldens.safetensors"),
              metadata={"format": "pt", "transformers": __import__("transformers").__version__,
                        "torch": torch.__version__})


if __name__ == "__main__":
    main()
