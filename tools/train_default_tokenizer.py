#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer of the embedded default model (issue 16) with HF `tokenizers`
on the corpus of tools/make_default_corpus.py: Qwen's normalizer (NFC), pre-tokenizer regex and
byte-level mapping, and Qwen's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>, <think>,
</think>, tool-call tags) after the learned vocabulary, as Qwen's tokenizers place them.

usage: tools/train_default_tokenizer.py CORPUS_DIR OUT_DIR [--vocab-size 8192]

Writes OUT_DIR/tokenizer.json. Deterministic for a given corpus and `tokenizers` version (one
thread: BPE merge ties are then broken the same way every run).
"""
import argparse
import os

# Qwen2/Qwen3's pre-tokenizer split (digits one at a time).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                  "</tool_call>", "<tool_response>", "</tool_response>"]
SEPARATOR = "\n\f\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", help="folder with train.txt (tools/make_default_corpus.py)")
    ap.add_argument("out", help="output folder")
    ap.add_argument("--vocab-size", type=int, default=8192, help="learned tokens plus the special tokens")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    docs = open(os.path.join(args.corpus, "train.txt"), encoding="utf-8").read().split(SEPARATOR)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size - len(SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)  # ids after the learned vocabulary
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    held = open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8").read()
    n = len(tok.encode(held).ids)
    print(f"vocabulary {tok.get_vocab_size()} ({len(SPECIAL_TOKENS)} special); held-out text: {len(held)} characters, "
          f"{n} tokens ({len(held) / n:.2f} characters a token)")


if __name__ == "__main__":
    main()
