#!/usr/bin/env python3
"""Train the embedded default model (issue 16): a small Qwen3.5-MoE (Gated DeltaNet + gated
attention + MoE with a shared expert) with transformers' own Qwen3_5Moe classes, plus the one MTP
layer of the Qwen3.5 checkpoints trained on the token after next from the main model's post-norm
hidden states, on the corpus of tools/make_default_corpus.py with the tokenizer of
tools/train_default_tokenizer.py. Writes a Hugging Face folder that transformers and Fathom load.

usage: tools/train_default_model.py CORPUS_DIR TOKENIZER_DIR OUT_DIR [--minutes 4] [--seed 0]
                                    [--chat-fraction 0.3] [--resume OUT_DIR/train_state.pt]

Seeded (torch and the batch order), resumable (train_state.pt: weights, optimizer, step, RNG),
time-budgeted: it trains until --minutes have passed, then evaluates the held-out perplexity of
the main model and the MTP layer's top-1 agreement with the token after next, and saves. Needs
torch, transformers (5.17 has the Qwen3_5Moe classes), tokenizers and safetensors; a GPU.

The MTP layer reads the main model's post-norm hidden state h_t and the next token x_{t+1}:
u = fc([norm_e(embed(x_{t+1})) | norm_h(h_t)]) (embedding first), one full-attention MoE decoder
layer, norm, and the shared lm_head predicting x_{t+2}; the same as Fathom's engines and
tools/make_fixtures.py's reference. Its loss does not reach the main model (h_t is detached).
"""
import argparse
import copy
import json
import math
import os
import random
import time

SEPARATOR = "\n\f\n"
EOS = "<|endoftext|>"


def text_config(vocab, eos_id):
    from transformers import Qwen3_5MoeTextConfig
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=16, num_experts_per_tok=2,
        moe_intermediate_size=128, shared_expert_intermediate_size=256, max_position_embeddings=8192,
        rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, tie_word_embeddings=False,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25,
                             mrope_section=[4, 2, 2], mrope_interleaved=True),
        eos_token_id=eos_id, bos_token_id=None, pad_token_id=None,
        mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False, router_aux_loss_coef=0.01,
    )


class Mtp:
    """The MTP layer's modules (fc, three norms, one full-attention decoder layer)."""

    def __init__(self, cfg, dev):
        import torch.nn as nn
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm
        c = copy.deepcopy(cfg)
        c.num_hidden_layers = 1
        c.layer_types = ["full_attention"]
        H = cfg.hidden_size
        self.modules = nn.ModuleDict({
            "fc": nn.Linear(2 * H, H, bias=False),
            "pre_fc_norm_embedding": Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps),
            "pre_fc_norm_hidden": Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps),
            "layer": Qwen3_5MoeDecoderLayer(c, 0),
            "norm": Qwen3_5MoeRMSNorm(H, eps=cfg.rms_norm_eps),
        }).to(dev)

    def logits(self, lm, hidden, next_ids):
        """hidden [B, n, H] post-norm main-model states, next_ids [B, n]: logits for the token after."""
        import torch
        m = self.modules
        e = lm.get_input_embeddings()(next_ids)
        u = m["fc"](torch.cat([m["pre_fc_norm_embedding"](e), m["pre_fc_norm_hidden"](hidden)], dim=-1))
        B, n, _ = u.shape
        pos = torch.arange(n, device=u.device).view(1, 1, -1).expand(3, B, -1)
        cos_sin = lm.model.rotary_emb(u, pos)
        # No mask: the attention is then causal (as when transformers builds it for a prompt).
        v = m["layer"](u, position_embeddings=cos_sin, attention_mask=None, position_ids=pos[0])
        v = v[0] if isinstance(v, tuple) else v
        return lm.lm_head(m["norm"](v))

    def state_dict(self):
        """Tensors named as the Qwen3.5 checkpoints store them (mtp.*, experts fused)."""
        out = {}
        for k, v in self.modules.state_dict().items():
            if k.startswith("layer."):
                k = "layers.0." + k[len("layer."):]
            out["mtp." + k] = v
        return out


def tokens_of(path, tok, eos_id):
    import numpy as np
    docs = open(path, encoding="utf-8").read().split(SEPARATOR)
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return np.array(ids, dtype=np.int32)


def chat_rows(path, tok, template_dir, length, seed):
    """Training rows in the chat format the model will be spoken to in: each document becomes a
    conversation rendered by the tokenizer folder's own chat template (user: "Continue this
    text:" and the document's first sentences; assistant: the rest), then its tokens, cut or
    padded with <|endoftext|> to `length`. Returns a list of int lists (one row a document)."""
    import random as _random
    import jinja2
    cfg = json.load(open(os.path.join(template_dir, "tokenizer_config.json"), encoding="utf-8"))
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **_: json.dumps(x, ensure_ascii=False)
    template = env.from_string(cfg["chat_template"])
    rng = _random.Random(seed)
    pad = tok.token_to_id(EOS)
    rows = []
    for doc in open(path, encoding="utf-8").read().split(SEPARATOR):
        cut = doc.find(". ", int(len(doc) * rng.uniform(0.15, 0.4)))
        if cut < 0 or cut > 600 or len(doc) - cut < 40:
            continue
        messages = [{"role": "user", "content": "Continue this text:\n" + doc[:cut + 1]},
                    {"role": "assistant", "content": "<think>\n\n</think>\n\n" + doc[cut + 2:]}]
        text = template.render(messages=messages, tools=None, add_generation_prompt=False)
        ids = tok.encode(text, add_special_tokens=False).ids[:length]
        rows.append(ids + [pad] * (length - len(ids)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=4.0, help="training time budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--resume", help="train_state.pt of an earlier run")
    ap.add_argument("--state", help="where to write train_state.pt (default OUT_DIR/train_state.pt)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--chat-fraction", type=float, default=0.0,
                    help="share of each batch's rows in the chat format (chat_rows); 0: plain text only")
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    from transformers import Qwen3_5MoeForCausalLM

    t_start = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    train = tokens_of(os.path.join(args.corpus, "train.txt"), tok, eos_id)
    held = tokens_of(os.path.join(args.corpus, "heldout.txt"), tok, eos_id)
    print(f"train {len(train)} tokens, held out {len(held)}; tokenized in {time.time() - t_start:.1f} s", flush=True)

    cfg = text_config(tok.get_vocab_size(), eos_id)
    model = Qwen3_5MoeForCausalLM(cfg).to(dev)
    mtp = Mtp(cfg, dev)
    params = list(model.parameters()) + list(mtp.modules.parameters())
    print(f"parameters: main {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M, "
          f"MTP {sum(p.numel() for p in mtp.modules.parameters()) / 1e6:.2f} M", flush=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    step = 0
    rng = np.random.default_rng(args.seed)
    if args.resume:
        st = torch.load(args.resume, map_location=dev, weights_only=False)
        model.load_state_dict(st["model"])
        mtp.modules.load_state_dict(st["mtp"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        rng = st["rng"]
        torch.set_rng_state(st["torch_rng"])

    S, B = args.seq, args.batch
    train_t = torch.from_numpy(train.astype(np.int64))
    chat_t = None
    if args.chat_fraction > 0:
        chat_t = torch.tensor(chat_rows(os.path.join(args.corpus, "train.txt"), tok, args.tokenizer, S + 2, args.seed))
        print(f"chat rows: {len(chat_t)}", flush=True)
    n_chat = int(round(B * args.chat_fraction)) if chat_t is not None else 0
    budget = args.minutes * 60
    warmup = 100
    t_train = time.time()
    est_steps = None
    model.train()
    while True:
        elapsed = time.time() - t_train
        if elapsed > budget:
            break
        # Cosine decay over the time budget (steps are near constant in time once warm).
        frac = min(1.0, elapsed / budget)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_t) - S - 2, size=B - n_chat)
        rows = [train_t[s:s + S + 2] for s in starts]
        if n_chat:
            rows += [chat_t[i] for i in rng.integers(0, len(chat_t), size=n_chat)]
        x = torch.stack(rows).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            base = model.model(input_ids=x[:, :S])
            h = base.last_hidden_state  # post final norm
            logits = model.lm_head(h)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), x[:, 1:S + 1].reshape(-1))
            mlog = mtp.logits(model, h.detach()[:, :S], x[:, 1:S + 1])
            mtp_loss = F.cross_entropy(mlog.float().view(-1, mlog.shape[-1]), x[:, 2:S + 2].reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + args.mtp_weight * mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            tps = step * B * S / max(1e-9, time.time() - t_train) if not args.resume else 0
            print(f"step {step} lr {lr:.2e} loss {loss.item():.3f} mtp {mtp_loss.item():.3f} "
                  f"({time.time() - t_train:.0f} s, {tps:.0f} tok/s)", flush=True)

    # Held-out: perplexity of the main model, and how often the MTP layer's top-1 is the token
    # after next (what greedy MTP drafts would get accepted at K = 1 with an exact main model).
    model.eval()
    nll = count = agree = agree_n = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        held_t = torch.from_numpy(held.astype(np.int64))
        for s in range(0, len(held_t) - S - 2, S):
            x = held_t[s:s + S + 2][None].to(dev)
            h = model.model(input_ids=x[:, :S]).last_hidden_state
            logits = model.lm_head(h).float()
            nll += F.cross_entropy(logits[0], x[0, 1:S + 1], reduction="sum").item()
            count += S
            main_next = logits[0].argmax(-1)
            mlog = mtp.logits(model, h, x[:, 1:S + 1]).float()
            # Acceptance as speculative decoding sees it: the draft for position t+2 is accepted when
            # it equals the main model's own greedy choice there.
            want = logits[0, 1:].argmax(-1)
            agree += (mlog[0, :-1].argmax(-1) == want).sum().item()
            agree_n += want.numel()
            del main_next
    ppl = math.exp(nll / count)
    acc = agree / max(1, agree_n)
    print(f"held out: perplexity {ppl:.2f} over {count} tokens; MTP top-1 equals the main model's greedy token "
          f"after next {acc:.3f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    torch.save({"model": model.state_dict(), "mtp": mtp.modules.state_dict(), "opt": opt.state_dict(), "step": step,
                "rng": rng, "torch_rng": torch.get_rng_state()}, args.state or os.path.join(args.out, "train_state.pt"))
    save(model, mtp, cfg, args.out)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"steps": step, "batch": B, "seq": S, "minutes": args.minutes, "seed": args.seed,
                   "train_tokens_seen": step * B * S, "heldout_perplexity": ppl, "mtp_top1_agreement": acc,
                   "wall_seconds": time.time() - t_start}, f, indent=2)


def save(model, mtp, cfg, out, shard_bytes=15_000_000):
    """bf16 safetensors in the Qwen3.5 text layout (model.language_model.* would need the vision
    tower's config; the text-only class stores model.*), in shards of at most shard_bytes, the
    MTP tensors in their own file as the releases keep them."""
    import torch
    from safetensors.torch import save_file
    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    shards, size = [{}], 0
    for k, v in sd.items():
        if size + v.numel() * 2 > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.numel() * 2
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    msd = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in mtp.state_dict().items()}
    save_file(msd, os.path.join(out, "mtp.safetensors"), metadata={"format": "pt"})
    weight_map.update({k: "mtp.safetensors" for k in msd})
    index = {"metadata": {}, "weight_map": weight_map}
    json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    c = cfg.to_dict()
    c["architectures"] = ["Qwen3_5MoeForCausalLM"]
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
