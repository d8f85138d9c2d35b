#!/usr/bin/env python3
"""Train a tiny deterministic byte-level BPE tokenizer for Fathom's random test models.

Usage:
    python tools/make_tiny_tokenizer.py OUT_DIR [--vocab-size 512]
                                        [--chat-template tests/fixtures/tokenizers/qwen3/tokenizer_config.json]

The checked-in fixtures (tests/fixtures/qwen35_moe, ...) are random models with vocab 512 and no
tokenizer. This writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json (and touches no
other file) so that the server, chat templates and streaming detokenization can be tested on them:

  ids 0..255            the 256 byte-level tokens (GPT-2 byte alphabet, sorted as HF does)
  ids 256..vocab-8      BPE merges learned from a small built-in English text
  ids vocab-7..vocab-1  <|endoftext|> <|im_start|> <|im_end|> (special) <think> </think>
                        <tool_call> </tool_call> (not special, as in Qwen3.5's tokenizer)
  eos_token = <|im_end|>, pad_token = <|endoftext|>

Normalizer NFC, pre-tokenizer = Qwen's split regex + ByteLevel(use_regex=False), ByteLevel decoder:
the same pipeline as Qwen3/Qwen3.5's tokenizer.json. Training is deterministic (one thread of
ordered input, fixed vocab size), so running it twice writes the same bytes.
Requires the `tokenizers` package.
"""
import argparse
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Once upon a time, there was a little girl who lived in a village near the forest. Whenever she went out,
the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood.
One morning, she asked her mother if she could go to visit her grandmother, as it had been a while since
they had seen each other. That is a good idea, her mother said. So they packed a nice basket for her to take.
The sun rose over the hills and the birds began to sing. The farmer walked to the field with his dog, and the
children played by the river until the evening came. In the city, people hurried to work, trains arrived
and departed, and the streets were full of noise and light.
Hello! How are you today? I am fine, thank you. What is your name? My name is Alice. Where do you live?
I live in a small house with a garden. Can you help me with this question? Of course, I would be happy to help.
Let me think about it step by step. First, we need to understand the problem. Then we can find a solution.
The answer is 42. Please explain your reasoning. The user asked a question and the assistant gave an answer.
You are a helpful assistant. Write a short story about a robot who learns to paint. Summarize the text below.
Translate the following sentence into French. What is the capital of France? The capital of France is Paris.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 -7 +12 50% $20 #1 @home (yes) [no] {maybe} a/b c|d e_f.
Code: def add(a, b): return a + b; for i in range(10): print(i) if x == y and not z: pass else: continue.
Science is the study of the natural world through observation and experiment. Water boils at one hundred
degrees. The earth goes around the sun once a year, and the moon goes around the earth about once a month.
Music, art and literature have been part of human life for thousands of years. Every language has words
for family, friends, food, home and the weather. It was raining yesterday, but today the weather is nice.
"""


def build(vocab_size: int) -> Tokenizer:
    n_added = len(SPECIAL) + len(NON_SPECIAL)
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    lines = TEXT.splitlines(keepends=True)
    tok.train_from_iterator(lines * 4, trainer=trainer, length=len(lines) * 4)
    if tok.get_vocab_size() != vocab_size - n_added:
        sys.exit(f"BPE training gave {tok.get_vocab_size()} tokens, wanted {vocab_size - n_added}: "
                 "extend the built-in text")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    for i, t in enumerate(SPECIAL + NON_SPECIAL):
        assert tok.token_to_id(t) == vocab_size - n_added + i, t
    return tok


def tokenizer_config(tok: Tokenizer, chat_template: str) -> dict:
    decoder = {}
    for t in SPECIAL + NON_SPECIAL:
        decoder[str(tok.token_to_id(t))] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                            "single_word": False, "special": t in SPECIAL}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": SPECIAL,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--vocab-size", type=int, default=512)
    # Qwen3's template (its tokenizer files are test fixtures); a .jinja file works too. The
    # Qwen3.5 template is not ours to ship: tests that need it read it from ../shared.
    ap.add_argument("--chat-template", default=os.path.join(
        here, "..", "tests", "fixtures", "tokenizers", "qwen3", "tokenizer_config.json"))
    a = ap.parse_args()
    with open(a.chat_template, encoding="utf-8") as f:
        chat_template = f.read()
    if a.chat_template.endswith(".json"):
        chat_template = json.loads(chat_template)["chat_template"]
    tok = build(a.vocab_size)
    os.makedirs(a.out_dir, exist_ok=True)
    tok.save(os.path.join(a.out_dir, "tokenizer.json"), pretty=True)
    with open(os.path.join(a.out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, chat_template), f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {a.out_dir}/tokenizer.json and tokenizer_config.json (vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
