"""CI subset of the real-world JSON Schema corpus check (tests/grammar/schema_corpus.py): every
25th schema of each source (about 200; built from pip-installed packages by
tools/make_schema_corpus.py), 4 seeded random outputs each at the default model's vocabulary, all
valid under Python jsonschema, and at least 95% of the schemas accepted. The whole corpus:
    python3 tests/grammar/schema_corpus.py --tool build/schema_check \
        --tokenizer tests/fixtures/tokenizers/fathom_default/tokenizer.json
"""
import argparse
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    tool = os.path.join(os.path.dirname(os.path.abspath(args.fathom)), "schema_check")
    tokenizer = os.path.join(args.fixtures, "tokenizers", "fathom_default", "tokenizer.json")
    return subprocess.run([sys.executable, os.path.join(here, "schema_corpus.py"), "--tool", tool, "--tokenizer",
                           tokenizer, "--every", "25", "--samples", "4", "--min-accept", "0.95"]).returncode


if __name__ == "__main__":
    sys.exit(main())
