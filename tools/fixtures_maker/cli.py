"""The command line: arguments, the run, re-verification of the bf16 fixtures, the summary."""

import argparse
import os
import time
from collections import OrderedDict

import torch
import transformers
from safetensors import safe_open

from .bookkeeping import load_ref
from .common import SEED
from .goldens import make_prompts
from .qwen3 import fixture_qwen3_dense, fixture_qwen3_next
from .qwen35 import fixture_qwen35
from .qwen35_fp8_block import fixture_qwen35_fp8_block
from .qwen35_fp8_mixed import fixture_qwen35_fp8_mixed
from .qwen35_nvfp4 import fixture_qwen35_nvfp4
from .st_io import dtype_str, read_dir_tensors

NEW_FIXTURES = OrderedDict([
    ("qwen35_moe_fp8_mixed", lambda out, dev, prompts, base: fixture_qwen35_fp8_mixed(out, dev, prompts, base)),
    ("qwen35_moe_fp8_mixed_w4a16_head", lambda out, dev, prompts, base: fixture_qwen35_fp8_mixed(
        out, dev, prompts, base, name="qwen35_moe_fp8_mixed_w4a16_head", w4a16_head=True)),
    ("qwen35_moe_fp8_block", lambda out, dev, prompts, base: fixture_qwen35_fp8_block(out, dev, prompts, base)),
])


def reverify(d, cls, dev, prompts, mtp=False):
    """Reload a bf16 fixture and re-check logits against the goldens file."""
    ref = load_ref(cls, d, dev)
    g, _ = read_goldens(d)
    worst = 0.0
    with torch.no_grad():
        for i, _ in enumerate(prompts):
            p = g[f"prompt_{i}"].long()
            lg = ref(input_ids=p[None].to(dev)).logits[0].float().cpu()
            worst = max(worst, float((lg - g[f"logits_{i}"]).abs().max()))
    assert worst < 1e-3, f"{d}: reloaded logits differ from goldens by {worst}"
    return worst


def read_goldens(d):
    out = OrderedDict()
    with safe_open(os.path.join(d, "goldens.safetensors"), "pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    return out, None


def describe(d, limit_layer=("layers.0.", "layers.3.")):
    t, where = read_dir_tensors(d)
    lines = []
    for k, v in t.items():
        if ".layers." in k and not any(s in k for s in limit_layer) and not k.startswith("mtp."):
            continue
        if ".experts." in k and any(f".experts.{e}." in k for e in range(1, 64)):
            continue
        lines.append(f"    {k:78s} {dtype_str(v):8s} {list(v.shape)}  [{where[k]}]")
    return "\n".join(lines)


def main(doc=None):
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--list-tensors", action="store_true", help="print tensor names/shapes of layers 0 and 3")
    ap.add_argument("--only", default=None,
                    help="comma-separated subset of the fixtures derived from an already written qwen35_moe folder ("
                         + ", ".join(NEW_FIXTURES) + "); nothing else is (re)written")
    ap.add_argument("--base", default=None, help="with --only: the qwen35_moe folder to derive from "
                                                 "(default: OUT/qwen35_moe)")
    args = ap.parse_args()
    t0 = time.time()
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}")
    prompts = make_prompts(SEED)

    from transformers import Qwen3_5MoeForConditionalGeneration, Qwen3NextForCausalLM, Qwen3ForCausalLM
    results = []
    if args.only:
        names = [n for n in args.only.split(",") if n]
        unknown = [n for n in names if n not in NEW_FIXTURES]
        if unknown:
            ap.error(f"--only: unknown {unknown} (choices: {', '.join(NEW_FIXTURES)})")
        base = args.base or os.path.join(args.out, "qwen35_moe")
        for i, n in enumerate(names):
            print(f"[{i + 1}/{len(names)}] {n} (from {base})")
            results.append(NEW_FIXTURES[n](args.out, dev, prompts, base))
        print_summary(results, args, t0)
        return
    print("[1/7] qwen35_moe")
    d1, m1, ref1, mtp_sd, _ = fixture_qwen35(args.out, dev, prompts)
    results.append((d1, m1))
    print("[2/7] qwen35_moe_nvfp4")
    d2, m2 = fixture_qwen35_nvfp4(args.out, dev, prompts, d1, ref1, mtp_sd)
    results.append((d2, m2))
    del ref1
    print("[3/7] qwen3_next")
    results.append(fixture_qwen3_next(args.out, dev, prompts))
    print("[4/7] qwen3_dense")
    results.append(fixture_qwen3_dense(args.out, dev, prompts))
    # derived from the qwen35_moe folder as written (the same path as --only)
    for i, n in enumerate(NEW_FIXTURES):
        print(f"[{5 + i}/7] {n}")
        results.append(NEW_FIXTURES[n](args.out, dev, prompts, d1))

    print("re-verifying bf16 fixtures from disk ...")
    for d, cls in ((d1, Qwen3_5MoeForConditionalGeneration), (results[2][0], Qwen3NextForCausalLM),
                   (results[3][0], Qwen3ForCausalLM)):
        w = reverify(d, cls, dev, prompts)
        print(f"  {os.path.basename(d)}: max |logits - golden| = {w:.3g}")

    print_summary(results, args, t0)


def print_summary(results, args, t0):
    if args.list_tensors:
        for d, _ in results:
            print(f"\n== {os.path.basename(d)}\n" + describe(d))

    print()
    hdr = f"{'fixture':32s} {'files':>5s} {'bytes':>9s} {'min_margin':>10s} {'med_margin':>10s} {'max|logit|':>10s} {'spread0':>8s}"
    print(hdr)
    print("-" * len(hdr))
    total = 0
    for d, m in results:
        files = sorted(os.listdir(d))
        b = sum(os.path.getsize(os.path.join(d, f)) for f in files)
        total += b
        print(f"{os.path.basename(d):32s} {len(files):5d} {b:9d} {m['min_greedy_margin']:10.4f} "
              f"{m['median_greedy_margin']:10.4f} {m['max_abs_logit']:10.3f} {m['logits_spread']:8.3f}")
    print(f"{'TOTAL':32s} {'':5s} {total:9d}")
    print(f"done in {time.time() - t0:.1f} s")
