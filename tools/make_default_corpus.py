#!/usr/bin/env python3
"""Build the text corpus of the embedded default model (issue 16) from Debian packages whose
licences allow shipping a model trained on them: two public-domain Bibles (narrative prose), the
fortune cookie files (short English of every kind) and the Python documentation's reStructuredText
sources (technical prose and code).

usage:
    mkdir debs && (cd debs && apt-get download sword-text-web sword-text-kjv fortunes fortunes-min python3.11-doc)
    tools/make_default_corpus.py debs OUT_DIR

Writes OUT_DIR/train.txt and OUT_DIR/heldout.txt (documents separated by a blank line and a form
feed line, "\\f", which no document contains), and OUT_DIR/SOURCES.md naming each package, its
version and licence, and the document counts. Documents: a Bible chapter, one fortune, one
documentation page. Every 40th document (by its position in a fixed order) is held out for
evaluation. Deterministic: the same packages give the same bytes. Needs dpkg-deb and Python's
standard library only.
"""
import argparse
import html
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

SEPARATOR = "\n\f\n"
HELDOUT_EVERY = 40

PACKAGES = {
    "sword-text-web": "World English Bible (2015, with Deuterocanon): public domain",
    "sword-text-kjv": "King James Version (2006 edition): public domain",
    "fortunes": "fortune cookie files: BSD licence (Regents of the University of California), see its copyright",
    "fortunes-min": "fortune cookie files (minimal set): BSD licence, see its copyright",
    "python3.11-doc": "Python 3.11 documentation sources: PSF License Agreement (examples: Zero-Clause BSD)",
}


def extract(debs_dir, root):
    versions = {}
    for name in sorted(os.listdir(debs_dir)):
        if not name.endswith(".deb"):
            continue
        path = os.path.join(debs_dir, name)
        pkg = subprocess.run(["dpkg-deb", "-f", path, "Package"], check=True, capture_output=True, text=True).stdout.strip()
        if pkg not in PACKAGES:
            continue
        versions[pkg] = subprocess.run(["dpkg-deb", "-f", path, "Version"], check=True, capture_output=True,
                                       text=True).stdout.strip()
        subprocess.run(["dpkg-deb", "-x", path, root], check=True)
    missing = sorted(set(PACKAGES) - set(versions))
    if missing:
        sys.exit(f"missing packages in {debs_dir}: {', '.join(missing)} (apt-get download them)")
    return versions


# ---- SWORD zText modules (OSIS markup): verse index .bzv (block u32, offset u32, size u16), block
# index .bzs (offset u32, size u32, uncompressed u32), zlib blocks .bzz.
NOTE = re.compile(r"<note\b.*?</note>", re.S)
TITLE = re.compile(r"<title\b.*?</title>", re.S)
TAG = re.compile(r"<[^>]*>")
CHAPTER = re.compile(r'<chapter\b[^>]*\bsID="([^"]+)"')


def clean_verse(osis):
    text = TAG.sub("", TITLE.sub("", NOTE.sub("", osis)))
    text = html.unescape(text)
    return re.sub(r"\s+", " ", text).strip()


def bible_chapters(module_dir):
    chapters = []
    for testament in ("ot", "nt"):
        base = os.path.join(module_dir, testament)
        if not os.path.exists(base + ".bzs"):
            continue
        bzs, bzz, bzv = (open(base + ext, "rb").read() for ext in (".bzs", ".bzz", ".bzv"))
        blocks = {}

        def block(i):
            if i not in blocks:
                off, size, _ = struct.unpack_from("<III", bzs, i * 12)
                blocks[i] = zlib.decompress(bzz[off:off + size])
            return blocks[i]

        current = []
        for v in range(len(bzv) // 10):
            b, off, size = struct.unpack_from("<IIH", bzv, v * 10)
            if size == 0:
                continue
            raw = block(b)[off:off + size].decode("utf-8")
            if CHAPTER.search(raw) and current:  # a chapter starts: the previous one is a document
                chapters.append(" ".join(current))
                current = []
            verse = clean_verse(raw)
            if verse:
                current.append(verse)
        if current:
            chapters.append(" ".join(current))
    return [c for c in chapters if len(c) > 40]


def fortunes(root):
    docs = []
    folder = os.path.join(root, "usr/share/games/fortunes")
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        for cookie in text.split("\n%\n"):
            cookie = cookie.strip("%\n ").rstrip()
            if len(cookie) > 20:
                docs.append(cookie)
    return docs


def python_docs(root):
    docs = []
    base = os.path.join(root, "usr/share/doc/python3.11/html/_sources")
    for sub in ("tutorial", "howto", "faq", "library", "reference", "glossary.rst.txt"):
        path = os.path.join(base, sub)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".rst.txt"))
        for f in files:
            text = open(f, encoding="utf-8").read().replace("\f", "")
            if len(text) > 200:
                docs.append(text.strip())
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("debs", help="folder with the .deb files")
    ap.add_argument("out", help="output folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        versions = extract(args.debs, root)
        mods = os.path.join(root, "usr/share/sword/modules/texts/ztext")
        sources = [
            ("sword-text-web", bible_chapters(os.path.join(mods, "engWEB2015eb"))),
            ("sword-text-kjv", bible_chapters(os.path.join(mods, "engKJV2006eb"))),
            ("fortunes", fortunes(root)),  # both fortune packages install into one folder
            ("python3.11-doc", python_docs(root)),
        ]
    os.makedirs(args.out, exist_ok=True)
    train, heldout, counts = [], [], []
    index = 0
    for pkg, docs in sources:
        kept = held = 0
        for d in docs:
            assert "\f" not in d
            (heldout if index % HELDOUT_EVERY == HELDOUT_EVERY - 1 else train).append(d)
            held += index % HELDOUT_EVERY == HELDOUT_EVERY - 1
            kept += 1
            index += 1
        counts.append((pkg, kept, held, sum(len(d) for d in docs)))
    for name, docs in (("train.txt", train), ("heldout.txt", heldout)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write(SEPARATOR.join(docs) + "\n")
    with open(os.path.join(args.out, "SOURCES.md"), "w", encoding="utf-8") as f:
        f.write("# Sources of the default model's training text\n\n")
        f.write("Built by tools/make_default_corpus.py from these Debian 12 packages (every 40th document "
                "held out):\n\n| package | version | licence | documents | held out | characters |\n"
                "|---|---|---|---|---|---|\n")
        for pkg, kept, held, chars in counts:
            f.write(f"| {pkg} | {versions[pkg]} | {PACKAGES[pkg]} | {kept} | {held} | {chars} |\n")
        f.write("| fortunes-min | " + versions["fortunes-min"] + " | " + PACKAGES["fortunes-min"] +
                " | (in fortunes' folder) | | |\n")
    total = sum(c[3] for c in counts)
    print(f"{len(train)} training and {len(heldout)} held-out documents, {total / 1e6:.1f} M characters -> {args.out}")


if __name__ == "__main__":
    main()
