#!/usr/bin/env python3
"""Builds the tokenizer test corpus and the HF `tokenizers` reference ids.

Writes (deterministically, seeded):
  tests/fixtures/tokenizer/corpus.json            list of strings (>= 2000)
  tests/fixtures/tokenizer/expected_<name>.json   {"no_special": [[ids]], "special_idx": [i], "special": [[ids]]}
      for qwen3, llama3, deepseek_v3 and qwen35 (Qwen3's tokenizer.json with the Qwen3.5 regex)
  tests/fixtures/tokenizer/synthetic.json         a small byte-level BPE plus component variants
                                                  (Split behaviours, Digits, added-token flags, ...)
Reads the real tokenizers from tests/fixtures/tokenizers/{qwen3,llama3,deepseek_v3}.
Usage: python3 tools/make_tokenizer_corpus.py [--tokenizers tests/fixtures/tokenizers] [--out tests/fixtures/tokenizer]
Needs: pip install tokenizers
"""
import argparse
import copy
import json
import os
import random
import sys

SEED = 20240601

QWEN3_SPLIT = ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", " ?[^\\s\\p{L}\\p{N}]+")
QWEN35_SPLIT = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+", " ?[^\\s\\p{L}\\p{M}\\p{N}]+")


def qwen35_from_qwen3(tok_json: dict) -> dict:
    """Qwen3.5's tokenizer is Qwen3's with marks counted as letters in the pre-tokenizer regex."""
    j = copy.deepcopy(tok_json)
    for p in j["pre_tokenizer"]["pretokenizers"]:
        if p["type"] == "Split":
            r = p["pattern"]["Regex"]
            for a, b in zip(QWEN3_SPLIT, QWEN35_SPLIT):
                assert a in r, r
                r = r.replace(a, b)
            p["pattern"]["Regex"] = r
    return j


PHRASES = {
    "en": ["The quick brown fox jumps over the lazy dog.", "I'm sure you're right, but they'll say we'd've known.",
           "HELLO WORLD!!! It'S tIMe", "e-mail: john.doe@example.com, tel. +1 (555) 010-9999",
           "The year 2024 had 366 days; pi ~ 3.14159265358979."],
    "fr": ["Ça va très bien, merci ! L'été à Paris est magnifique.", "Où est la bibliothèque ? À côté de l'hôpital."],
    "de": ["Größenwahnsinnige Straßenbahnhaltestellenüberdachung", "Fußgängerübergänge sind äußerst wichtig."],
    "es": ["¿Dónde está el niño? ¡Mañana será otro día!", "La pingüina comió piñas en Cádiz."],
    "pt": ["Não há coração sem razão; ações e condições.", "Avó, avô e irmã foram à praça."],
    "pl": ["Zażółć gęślą jaźń.", "Łódź i Kraków są pięknymi miastami."],
    "cs": ["Příliš žluťoučký kůň úpěl ďábelské ódy.", "Čeština má háčky a čárky."],
    "tr": ["İstanbul'da ılık bir gün; Iğdır ve Şanlıurfa.", "ğüşıöç ĞÜŞİÖÇ"],
    "vi": ["Tiếng Việt có nhiều dấu: ả, ạ, ằ, ẵ, ệ, ỗ, ữ.", "Người Việt Nam yêu hòa bình."],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Москва — столица России."],
    "uk": ["Жебракують філософи при ґанку церкви в Гадячі.", "Їжак і ґудзик."],
    "el": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Καλημέρα κόσμε! Ἀρχιμήδης ᾠδή"],
    "ar": ["مرحبا بالعالم! كيف حالك اليوم؟", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ ١٢٣٤٥"],
    "he": ["שלום עולם! מה שלומך?", "עִבְרִית עם נִקּוּד"],
    "fa": ["سلام دنیا، حال شما چطور است؟ ۱۲۳۴"],
    "hi": ["नमस्ते दुनिया! आप कैसे हैं?", "हिन्दी में संयुक्ताक्षर: क्ष त्र ज्ञ श्र"],
    "bn": ["আমি বাংলায় গান গাই।"],
    "ta": ["வணக்கம் உலகம்"],
    "th": ["สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ", "กรุงเทพมหานคร อมรรัตนโกสินทร์"],
    "zh": ["你好，世界！今天天气很好。", "人工智能正在改变我们的生活方式，包括医疗、教育和交通。", "繁體中文：臺灣的龍與鳥"],
    "ja": ["こんにちは世界。カタカナとひらがなと漢字を混ぜます。", "ｶﾀｶﾅ半角とＦＵＬＬＷＩＤＴＨ文字"],
    "ko": ["안녕하세요 세계! 한국어는 한글로 씁니다.", "대한민국 서울특별시"],
    "ka": ["გამარჯობა მსოფლიო"],
    "hy": ["Բարեւ աշխարհ"],
    "am": ["ሰላም ልዑል"],
    "my": ["မင်္ဂလာပါ ကမ္ဘာ"],
    "km": ["សួស្តី​ពិភពលោក"],
    "si": ["ආයුබෝවන් ලෝකය"],
    "mn": ["Сайн байна уу"],
}

CODE = [
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}?q=1&r=2`); return x ?? null; };",
    "fn main() {\n    let s: &str = \"hi\";\n    println!(\"{s:?} {}\", s.len());\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"héllo\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "<!DOCTYPE html>\n<html><body><div class=\"a b\">&amp;&lt;x&gt;</div></body></html>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"\\u00e9\"}}",
    "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$' >> /tmp/out.txt; done",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # comment\r\n\r\n",
    "    \t\tif (a && b || !c) { x <<= 2; y >>= 3; z != w; }",
    "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x^2} dx = \\frac{\\sqrt{\\pi}}{2} \\end{equation}",
    "https://example.com/path/to/page?query=some%20value&x=1#fragment",
    "public static void main(String[] args) { System.out.println(\"Hello\"); }",
    "-- lua\nlocal t = {}\nfor k, v in pairs(t) do print(k, v) end",
]

EMOJI = ["😀", "👍", "👍🏻", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵", "🇩🇪", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "1️⃣", "#️⃣",
         "❤️", "❤", "🧑‍🤝‍🧑", "🤷‍♂️", "🙏🏾", "🫠", "🥲", "🦀", "🐍", "☃", "✨", "🎉🎉🎉"]

NFC_NFD = [("é", "e\u0301"), ("Å", "A\u030a"), ("ñ", "n\u0303"), ("ö", "o\u0308"), ("ệ", "e\u0323\u0302"),
           ("한", "\u1112\u1161\u11ab"), ("가", "\u1100\u1161"), ("Ǖ", "U\u0308\u0304"), ("ḉ", "c\u0327\u0301"),
           ("\u212b", "A\u030a"), ("\u2126", "\u03a9"), ("ﬁ", "ﬁ"), ("ώ", "\u03c9\u0301"), ("ǘ", "u\u0308\u0301")]

ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060", "\u00ad", "\u202e", "\u202d", "\u200e", "\u200f",
              "\u034f", "\u061c", "\u180e"]

SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003", "\u0085", "\u2028", "\u2029", "\u000b",
          "\u000c", "\u1680", "\u202f", "\u205f"]

UNICODE_BLOCKS = [(0x20, 0x7e), (0xa0, 0xff), (0x100, 0x17f), (0x180, 0x24f), (0x250, 0x2af), (0x300, 0x36f),
                  (0x370, 0x3ff), (0x400, 0x4ff), (0x530, 0x58f), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f),
                  (0x980, 0x9ff), (0xe00, 0xe7f), (0x10a0, 0x10ff), (0x1100, 0x11ff), (0x1e00, 0x1eff),
                  (0x2000, 0x206f), (0x20a0, 0x20cf), (0x2100, 0x214f), (0x2190, 0x21ff), (0x2200, 0x22ff),
                  (0x2500, 0x257f), (0x3040, 0x309f), (0x30a0, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
                  (0xff00, 0xffef), (0x1d400, 0x1d7ff), (0x1f300, 0x1f6ff), (0x1f900, 0x1f9ff), (0x20000, 0x2a6df),
                  (0xe000, 0xf8ff), (0x1f1e6, 0x1f1ff), (0xfe00, 0xfe0f), (0x10000, 0x1007f)]

ODD_VALID = ["\ufffd", "\ufffe", "\uffff", "\U0010ffff", "\U0001fffe", "\ue000", "\U000f0000", "\u0000", "\x7f",
             "\u0080", "\u009f", "\U0001d11e", "\U000e0001", "\U000e007f"]


def special_tokens_of(tok_json):
    return [a["content"] for a in tok_json["added_tokens"]]


def rand_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(UNICODE_BLOCKS)
        c = rng.randint(lo, hi)
        if 0xd800 <= c <= 0xdfff:
            c = 0x41
        out.append(chr(c))
    return "".join(out)


def rand_ws(rng, n):
    return "".join(rng.choice(SPACES) for _ in range(n))


def make_corpus(rng, specials_by_name):
    c = []
    all_phrases = [p for ps in PHRASES.values() for p in ps]
    c += all_phrases
    c += CODE
    c += EMOJI
    c += ["".join(EMOJI), " ".join(EMOJI), "Flags: 🇺🇸🇯🇵🇩🇪🇫🇷 and 🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
    for a, b in NFC_NFD:
        c += [a, b, f"caf{a}", f"caf{b}", f" {b}{b} x{b}", a + b]
    c += [f"a{z}b" for z in ZERO_WIDTH] + ["".join(ZERO_WIDTH), "zero\u200bwidth\u200djoin"]
    c += [f"x{o}y" for o in ODD_VALID] + ["".join(ODD_VALID)]
    c += ["".join(chr(i) for i in range(0, 32)), "".join(chr(i) for i in range(0x7f, 0xa0)),
          "tab\there\x00null\x1bescape\x07bell"]
    # contractions and apostrophes
    c += ["I'm, you're, he's, we'll, they'd, I've, can't", "I'M YOU'RE HE'S WE'LL THEY'D I'VE CAN'T",
          "It's 'quoted' ''s '' 're", "don’t won’t it’s", "'s't're've'm'll'd", " 'S 'T 'Re"]
    # whitespace runs
    for n in [1, 2, 3, 5, 8, 16, 33, 100, 257]:
        c += [" " * n, "\t" * n, "\n" * n, "\r\n" * n, f"a{' ' * n}b", f"a{chr(10) * n}b", f"x\n{' ' * n}y",
              f"end{' ' * n}", f"{' ' * n}start"]
    for _ in range(120):
        c.append(rand_ws(rng, rng.randint(1, 60)))
        c.append("w" + rand_ws(rng, rng.randint(1, 30)) + "w" + rand_ws(rng, rng.randint(1, 5)))
    # digits
    for n in [1, 2, 3, 4, 5, 7, 10, 16, 33, 100, 500]:
        c.append("".join(rng.choice("0123456789") for _ in range(n)))
        c.append("x" + "".join(rng.choice("0123456789") for _ in range(n)) + "y")
    c += ["1,234,567.89", "3.14159e-10", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "²³¹¼½¾", "Ⅷ Ⅻ ⅻ", "१२३४५",
          "๑๒๓", "12:30:45 2024-06-01T00:00:00Z", "$100.00 €50 ¥1000 £3", "0x1F 0b1010 1e9 -0.0"]
    # special tokens inline
    for name, specials in specials_by_name.items():
        common = [s for s in specials if not s.startswith("<|reserved_special_token_")][:40]
        common += [s for s in specials if s.startswith("<|reserved")][:4]
        for s in common:
            c.append(s)
            c.append(f"Hello{s}world")
            c.append(f" {s} ")
            c.append(f"{s}{s}\n{s}")
        for _ in range(40):
            parts = []
            for _ in range(rng.randint(2, 6)):
                parts.append(rng.choice(common) if rng.random() < 0.5 else rng.choice(all_phrases + CODE))
            c.append(rng.choice(["", " ", "\n"]).join(parts))
        c += [specials[0][:-1], specials[0][1:], specials[0] + specials[0][:3]]
    c += ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
          "<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>",
          "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<think>reasoning</think>answer",
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"]
    # long words
    c += ["a" * 3000, "ab" * 1000, "supercalifragilisticexpialidocious" * 30, "你" * 1500, "的一是在不了有和" * 150,
          "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2000)),
          "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(1500)),
          "pneumonoultramicroscopicsilicovolcanoconiosis", "Donaudampfschifffahrtsgesellschaftskapitän",
          "https://" + "very-long-domain-name." * 20 + "com/" + "path/" * 30, "!" * 500, "=-" * 400, "😀" * 300,
          "e\u0301" * 400, "\u0301" * 100, "ก" * 800]
    # random unicode soup
    for _ in range(500):
        c.append(rand_unicode(rng, rng.randint(1, 40)))
    for _ in range(150):
        c.append(rand_unicode(rng, rng.randint(40, 400)))
    # combining marks on random bases
    marks = [chr(x) for x in range(0x300, 0x36f)] + ["\u0951", "\u093c", "\u0e31", "\u05b4", "\u064e", "\u20dd"]
    for _ in range(150):
        s = ""
        for _ in range(rng.randint(1, 12)):
            s += rng.choice("aeiouxyzAEIOU αβγдж日한ก ") + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
        c.append(s)
    # mixtures of everything
    pools = [all_phrases, CODE, EMOJI, [a for a, _ in NFC_NFD] + [b for _, b in NFC_NFD], ZERO_WIDTH, SPACES,
             ODD_VALID, ["123", "4567", "89", "2024"], ["'s", "'re", "'LL", "'d"]]
    while len(c) < 2300:
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 12))]
        sep = rng.choice(["", " ", "\n", "  ", "\t"])
        s = sep.join(parts)
        if rng.random() < 0.3:
            a = rng.randint(0, len(s))
            s = s[a:a + rng.randint(1, 80)]
        c.append(s)
    return c


def tiny_bpe(qwen_json, n_merges=600):
    """A small byte-level BPE: the 256 byte symbols plus the first Qwen3 merges that close over them."""
    vocab = {}
    for k, v in qwen_json["model"]["vocab"].items():
        if v < 256:
            vocab[k] = v
    merges = []
    for a, b in qwen_json["model"]["merges"]:
        if len(merges) >= n_merges:
            break
        if a in vocab and b in vocab and a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append([a, b])
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges}


def synthetic(qwen_json, corpus, rng):
    model = tiny_bpe(qwen_json)
    nv = len(model["vocab"])
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    base = {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": nv, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True},
                             {"id": nv + 1, "content": "</s>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": bl, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": model}
    variants = []
    for beh in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for inv in [False, True]:
            variants.append((f"split_{beh}_{'inv' if inv else 'noinv'}", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "\\s+|\\p{N}"}, "behavior": beh, "invert": inv}, bl]}}))
    variants.append(("split_string_removed", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": ", "}, "behavior": "Removed", "invert": False}, bl]}}))
    variants.append(("split_string_merged_next", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": "."}, "behavior": "MergedWithNext", "invert": False}, bl]}}))
    variants.append(("digits_individual", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, bl]}}))
    variants.append(("digits_contiguous", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, bl]}}))
    variants.append(("bytelevel_gpt2", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True,
                                                          "trim_offsets": True, "use_regex": True}}))
    variants.append(("bytelevel_regex_noprefix", {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                                                    "trim_offsets": True, "use_regex": True}}))
    variants.append(("nfd", {"normalizer": {"type": "NFD"}}))
    variants.append(("nfkc_seq", {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}]}}))
    variants.append(("template_bos_eos", {"post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [nv], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [nv + 1], "tokens": ["</s>"]}}}}))
    m2 = copy.deepcopy(model)
    m2["merges"] = [f"{a} {b}" for a, b in model["merges"]]
    m2["ignore_merges"] = True
    variants.append(("string_merges_ignore_merges", {"model": m2}))
    flags = []
    for k, (content, lstrip, rstrip, single, norm) in enumerate([
            ("<mask>", True, False, False, False), ("[R]", False, True, False, False),
            ("word", False, False, True, False), ("BOTH", True, True, False, False),
            ("e\u0301x", False, False, False, True), ("éy", False, False, False, True),
            ("<mas", False, False, False, False), ("<mask>>", False, False, False, False)]):
        flags.append({"id": nv + 2 + k, "content": content, "single_word": single, "lstrip": lstrip,
                      "rstrip": rstrip, "normalized": norm, "special": k % 2 == 0})
    variants.append(("added_flags", {"added_tokens": base["added_tokens"] + flags}))
    variants.append(("added_flags_nfc", {"added_tokens": base["added_tokens"] + flags, "normalizer": {"type": "NFC"}}))
    variants.append(("seq_digits_split", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "MergedWithPrevious", "invert": False}, bl]}}))
    strings = [s for s in corpus if len(s) < 120]
    rng.shuffle(strings)
    strings = strings[:60] + [
        "a <mask> b", "a   <mask>   b", "<mask>", "x[R]   y", "[R]\n\nz", "a word b", "aword b", "a words", "word",
        "_word", "word_", "x BOTH  y", "cafe\u0301x caféx éy e\u0301y", "<mas <mask>> <mask>>", "<s>hi</s>",
        "1, 2, 3, 4", "a.b.c..d.", "...", "  lead", "trail  ", "12ab34cd", "abc123def 456"]
    from tokenizers import Tokenizer
    out = {"base": base, "strings": strings, "variants": []}
    for name, override in variants:
        j = copy.deepcopy(base)
        j.update(override)
        tok = Tokenizer.from_str(json.dumps(j))
        out["variants"].append({"name": name, "override": override,
                                "expected": [tok.encode(s, add_special_tokens=True).ids for s in strings]})
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=os.path.join(here, "..", "tests", "fixtures", "tokenizers"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer"))
    args = ap.parse_args()
    from tokenizers import Tokenizer

    tok_dir = args.tokenizers
    names = ["qwen3", "llama3", "deepseek_v3"]
    jsons = {n: json.load(open(os.path.join(tok_dir, n, "tokenizer.json"), encoding="utf-8")) for n in names}
    rng = random.Random(SEED)
    corpus = make_corpus(rng, {n: special_tokens_of(jsons[n]) for n in names})
    os.makedirs(args.out, exist_ok=True)
    dump = lambda obj, path: open(path, "w", encoding="utf-8").write(
        json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    dump(corpus, os.path.join(args.out, "corpus.json"))
    toks = {n: Tokenizer.from_str(json.dumps(jsons[n])) for n in names}
    toks["qwen35"] = Tokenizer.from_str(json.dumps(qwen35_from_qwen3(jsons["qwen3"])))
    special_idx = sorted(rng.sample(range(len(corpus)), 300))
    results = {}
    for n, tok in toks.items():
        exp = {"tokenizers_version": __import__("tokenizers").__version__,
               "no_special": [e.ids for e in tok.encode_batch(corpus, add_special_tokens=False)],
               "special_idx": special_idx,
               "special": [tok.encode(corpus[i], add_special_tokens=True).ids for i in special_idx]}
        results[n] = exp
        if n == "qwen35":  # stored as a diff against qwen3 to keep the fixtures small
            base = results["qwen3"]["no_special"]
            exp["no_special_base"] = "qwen3"
            exp["no_special_diff"] = {str(i): ids for i, ids in enumerate(exp["no_special"]) if ids != base[i]}
            del exp["no_special"]
        dump(exp, os.path.join(args.out, f"expected_{n}.json"))
    dump(synthetic(jsons["qwen3"], corpus, rng), os.path.join(args.out, "synthetic.json"))
    print(f"{len(corpus)} strings -> {args.out}")


if __name__ == "__main__":
    main()
