#!/usr/bin/env python3
"""Distil the embedded default model's MTP layer from its own main model (issue 34), on the CPU.

The MTP layer was trained beside the main model on the corpus's token after next (cross-entropy
against the text, while the main model was still moving). What speculative decoding accepts is
agreement with the finished main model: a greedy draft is kept when it is the main model's argmax
at the next position, a drawn draft with probability sum_v min(p(v), q(v)). So this fits the MTP
layer alone, the main model frozen, to the main model's distribution there: KL(p || q), p = the
main model's softmax at position t+1, q = the MTP layer's at t (given h_t and the token x_{t+1}),
the EAGLE / Medusa-2 way of training draft heads. The main model and the shared lm_head do not
change, so every plain-decoding output of the default model stays what it was.

usage: tools/distill_default_mtp.py MODEL_DIR CORPUS_DIR OUT_DIR [--tokens 2000000] [--minutes 40]
       [--seq 256] [--batch 16] [--lr 1e-3] [--chat-fraction 0.15] [--seed 0] [--heldout-tokens N]

CORPUS_DIR is tools/make_default_corpus.py's output (train.txt, heldout.txt). Seeded (torch and
the window order); time-budgeted like tools/train_default_model.py. First the main model runs once
over --tokens training tokens in windows of --seq + 2 (its post-norm hidden states are kept in
bf16, as the engines hand them to the MTP layer), then the MTP layer trains on them until
--minutes have passed. Before and after, on every held-out window, it reports what the drafts
would be accepted at with teacher forcing: greedy (argmax q = argmax p), an argmax draft at
temperature 0.7 (p_0.7(argmax q)) and a drawn draft at 0.7 (sum min(p_0.7, q_0.7)). Writes
OUT_DIR/mtp.safetensors (bf16, the checkpoints' names) and OUT_DIR/distill_log.json. Needs torch,
transformers 5.17 (Qwen3_5Moe classes), tokenizers, safetensors; no GPU.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_default_model as tdm  # noqa: E402  (the MTP modules, the corpus readers)

DRAW_TEMPERATURE = 0.7


def load(model_dir):
    import torch
    from safetensors import safe_open
    from transformers import Qwen3_5MoeForCausalLM
    from fixtures_maker.bookkeeping import load_ref
    model = load_ref(Qwen3_5MoeForCausalLM, model_dir, torch.device("cpu"))
    for p in model.parameters():
        p.requires_grad_(False)
    # Causal attention in the MTP layer needs sdpa: eager attention without a mask sees every position.
    cfg = copy.deepcopy(model.config)
    cfg._attn_implementation = "sdpa"
    mtp = tdm.Mtp(cfg, torch.device("cpu"))
    with safe_open(os.path.join(model_dir, "mtp.safetensors"), "pt") as f:
        sd = {k: f.get_tensor(k).float() for k in f.keys()}
    own = {}
    for k, v in sd.items():
        k = k[len("mtp."):]
        own["layer." + k[len("layers.0."):] if k.startswith("layers.0.") else k] = v
    mtp.modules.load_state_dict(own, strict=True)
    return model, mtp


def hidden_rows(model, x, batch):
    """Post-norm hidden states of the main model over rows x [N, L], rounded to bf16."""
    import torch
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out.append(model.model(input_ids=x[i:i + batch]).last_hidden_state.to(torch.bfloat16))
    return torch.cat(out)


def losses_and_acceptance(model, mtp, x, h, sums=True):
    """x [B, S + 2] tokens, h [B, S + 1, H] hidden: the KL loss and (with `sums`, else None) the
    three acceptance sums and the positions."""
    import torch
    import torch.nn.functional as F
    S = x.shape[1] - 2
    with torch.no_grad():
        p_logits = model.lm_head(h[:, 1:S + 1].float())  # the main model's prediction of x[t + 2]
    q_logits = mtp.logits(model, h[:, :S].float(), x[:, 1:S + 1])
    logp = F.log_softmax(p_logits, -1)
    logq = F.log_softmax(q_logits, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean()
    if not sums:
        return kl, None
    with torch.no_grad():
        greedy = (q_logits.argmax(-1) == p_logits.argmax(-1)).float().sum().item()
        pt = F.softmax(p_logits / DRAW_TEMPERATURE, -1)
        qt = F.softmax(q_logits / DRAW_TEMPERATURE, -1)
        argmax_at_t = pt.gather(-1, q_logits.argmax(-1, keepdim=True)).sum().item()
        drawn_at_t = torch.minimum(pt, qt).sum().item()
    return kl, (greedy, argmax_at_t, drawn_at_t, q_logits.shape[0] * S)


def evaluate(model, mtp, held, S, batch):
    import torch
    import numpy as np
    starts = range(0, len(held) - S - 2, S)
    x = torch.from_numpy(np.stack([held[s:s + S + 2] for s in starts]).astype(np.int64))
    h = hidden_rows(model, x[:, :S + 1], batch)
    sums, kl_sum = [0.0] * 4, 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            kl, s = losses_and_acceptance(model, mtp, x[i:i + batch], h[i:i + batch])
            kl_sum += kl.item() * s[3]
            sums = [a + b for a, b in zip(sums, s)]
    n = sums[3]
    return {"positions": int(n), "kl": kl_sum / n, "greedy": sums[0] / n, "argmax_draft_t0.7": sums[1] / n,
            "drawn_draft_t0.7": sums[2] / n}


def training_rows(a, tok, eos_id, rng):
    import numpy as np
    import torch
    train = tdm.tokens_of(os.path.join(a.corpus, "train.txt"), tok, eos_id)
    L = a.seq + 2
    n_rows = a.tokens // a.seq
    n_chat = int(round(n_rows * a.chat_fraction))
    rows = [train[s:s + L] for s in rng.integers(0, len(train) - L, size=n_rows - n_chat)]
    if n_chat:
        chat = tdm.chat_rows(os.path.join(a.corpus, "train.txt"), tok, a.model, L, a.seed)
        rows += [np.array(chat[i], dtype=np.int32) for i in rng.integers(0, len(chat), size=n_chat)]
    x = torch.from_numpy(np.stack(rows).astype(np.int64))
    return x[torch.from_numpy(rng.permutation(len(x)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="training tokens the main model runs over")
    ap.add_argument("--minutes", type=float, default=40.0, help="training time budget, after the main model's pass")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--chat-fraction", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout-tokens", type=int, default=0, help="evaluate on this many held-out tokens (0: all)")
    a = ap.parse_args()

    import numpy as np
    import torch
    from tokenizers import Tokenizer

    t0 = time.time()
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    eos_id = tok.token_to_id(tdm.EOS)
    model, mtp = load(a.model)
    held = tdm.tokens_of(os.path.join(a.corpus, "heldout.txt"), tok, eos_id)
    if a.heldout_tokens:
        held = held[:a.heldout_tokens]
    before = evaluate(model, mtp, held, 512, a.batch // 2 or 1)
    print(f"held out before: {json.dumps(before)} ({time.time() - t0:.0f} s)", flush=True)

    x = training_rows(a, tok, eos_id, rng)
    t1 = time.time()
    h = hidden_rows(model, x[:, :a.seq + 1], a.batch)
    print(f"main model over {x.numel()} tokens in {time.time() - t1:.0f} s", flush=True)

    params = list(mtp.modules.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget, warmup, step, t_train = a.minutes * 60, 50, 0, time.time()
    mtp.modules.train()
    while time.time() - t_train < budget:
        frac = min(1.0, (time.time() - t_train) / budget)
        lr = a.lr * min(1.0, (step + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        i = (step * a.batch) % (len(x) - a.batch + 1)
        report = (step + 1) % 20 == 0 or step == 0  # the acceptance sums only for the steps reported
        kl, s = losses_and_acceptance(model, mtp, x[i:i + a.batch], h[i:i + a.batch], sums=report)
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if report:
            print(f"step {step} (epoch {step * a.batch / len(x):.2f}) lr {lr:.2e} kl {kl.item():.4f} "
                  f"greedy {s[0] / s[3]:.3f} drawn {s[2] / s[3]:.3f} ({time.time() - t_train:.0f} s)", flush=True)

    mtp.modules.eval()
    # Evaluate what is saved: the weights rounded to bf16 as the checkpoint stores them.
    with torch.no_grad():
        for p in params:
            p.copy_(p.to(torch.bfloat16).float())
    after = evaluate(model, mtp, held, 512, a.batch // 2 or 1)
    print(f"held out after: {json.dumps(after)}", flush=True)

    from safetensors.torch import save_file
    os.makedirs(a.out, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in mtp.state_dict().items()}
    save_file(sd, os.path.join(a.out, "mtp.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "distill_log.json"), "w") as f:
        json.dump({"steps": step, "batch": a.batch, "seq": a.seq, "tokens": int(x.numel()), "minutes": a.minutes,
                   "lr": a.lr, "chat_fraction": a.chat_fraction, "seed": a.seed, "heldout_before": before,
                   "heldout_after": after, "wall_seconds": time.time() - t0}, f, indent=2)


if __name__ == "__main__":
    main()
