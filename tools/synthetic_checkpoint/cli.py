"""The command line: arguments, the plan's summary, disk and memory checks, and the run (shards first,
then the index and config files)."""

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .common import FORMATS, MODELOPT_MIXED, REPO, die, gb
from .config_files import fp8_block_quant_config, generation_config, mixed_quant_files, out_config, quant_files
from .model import Model
from .plan import Planner
from .shards import Progress, pack_shards, write_shard
from .values import make_pools, pool_sizes

DEFAULT_SEED = 20250611


def find_tokenizer_dir():
    for d in (os.path.join(REPO, "tests", "fixtures", "tokenizers", "qwen3"), "/work/shared/fixtures/tokenizers/qwen3"):
        if os.path.isfile(os.path.join(d, "tokenizer.json")):
            return d
    return None


def resolve_config(arg):
    if os.path.isfile(arg):
        return arg
    for cand in (os.path.join(REPO, "configs", arg), os.path.join(REPO, "configs", arg + ".json")):
        if os.path.isfile(cand):
            return cand
    die(f"config '{arg}' not found (a path, or a name from {os.path.join(REPO, 'configs')}: "
        f"{', '.join(sorted(f[:-5] for f in os.listdir(os.path.join(REPO, 'configs')) if f.endswith('.json')))})")


OUR_FILES = ("model.safetensors.index.json", "config.json", "generation_config.json", "hf_quant_config.json",
             "tokenizer.json", "tokenizer_config.json", "mtp.safetensors")


def ours(fname):
    return fname in OUR_FILES or (fname.startswith("model-") and (fname.endswith(".safetensors")
                                                                  or fname.endswith(".safetensors.tmp"))) \
        or fname == "mtp.safetensors.tmp"


def free_bytes(path):
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return shutil.disk_usage(p).free, p


def memory_backed(path):
    """True if `path` lies on tmpfs/ramfs (writing there consumes RAM)."""
    p, best, fstype = os.path.realpath(path), "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        return False
    return fstype in ("tmpfs", "ramfs")


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring for the exact layout.")
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="[CONFIG] OUT_DIR: the config (path or configs/ name), then the output folder")
    ap.add_argument("--config", help="config path or configs/ name (instead of the first positional)")
    ap.add_argument("--format", choices=FORMATS, default="nvfp4",
                    help="nvfp4: ModelOpt NVFP4 export layout (default); bf16: the original BF16 release layout; "
                         "nvfp4-v2: ModelOpt MIXED_PRECISION (NVFP4 experts, FP8 attention/GDN/shared expert, "
                         "nvidia/Qwen3.5-397B-A17B-NVFP4-V2); nvfp4-mixed: the same with a W4A16 NVFP4 lm_head "
                         "(nvidia/Qwen3.6-35B-A3B-NVFP4); fp8-block: Qwen's -FP8 releases (128x128 block FP8)")
    ap.add_argument("--num-layers", type=int, help="keep the first N layers (layer pattern kept), default all")
    ap.add_argument("--mtp-layers", type=int, help="MTP layers to write (default: the config's mtp_num_hidden_layers; "
                    "1 for Qwen3-Next, whose release ships one); 0 = none")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--shard-size-gb", type=float, default=5.0, help="max shard size in GB (1e9 bytes), default 5")
    ap.add_argument("--experts", choices=("fused", "per-expert"),
                    help="bf16 routed-expert layout (default: fused for Qwen3.5, per-expert for Qwen3-Next); "
                         "nvfp4 experts are always per expert")
    ap.add_argument("--mtp-experts", choices=("fused", "per-expert"),
                    help="MTP routed-expert layout, always BF16 (default: bf16 -> as --experts, nvfp4 -> per-expert)")
    ap.add_argument("--shared-expert", choices=("nvfp4", "bf16"),
                    help="nvfp4 format: shared expert NVFP4 (default, as the ModelOpt export) or BF16 (then excluded)")
    ap.add_argument("--separate-mtp-file", action="store_true", help="write mtp.* into mtp.safetensors")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="shards written in parallel (default min(8, CPUs))")
    ap.add_argument("--fsync", action="store_true", help="fsync every shard (honest disk timing)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and sizes, write nothing")
    ap.add_argument("--list-tensors", action="store_true", help="with --dry-run: print every tensor")
    ap.add_argument("--force", action="store_true", help="replace this tool's files in a non-empty OUT_DIR")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap.parse_args()


def config_and_out(args):
    """The config's path and OUT_DIR, from `[CONFIG] OUT_DIR` or `--config CONFIG OUT_DIR`."""
    if len(args.paths) == 2:
        if args.config:
            die("give the config either as the first positional or as --config, not both")
        cfg_arg, out_dir = args.paths
    elif len(args.paths) == 1:
        if not args.config:
            die("missing CONFIG (positional before OUT_DIR, or --config)")
        cfg_arg, out_dir = args.config, args.paths[0]
    else:
        die("expected [CONFIG] OUT_DIR")
    return resolve_config(cfg_arg), out_dir


def choices(args, m):
    """Depth and expert layouts, checked against the model and the format:
    (num_layers, mtp_layers, experts_layout, mtp_experts_layout, shared_nvfp4)."""
    num_layers = m.L if args.num_layers is None else args.num_layers
    if not 1 <= num_layers <= m.L:
        die(f"--num-layers must be in 1..{m.L}")
    mtp_layers = m.mtp if args.mtp_layers is None else args.mtp_layers
    if mtp_layers < 0:
        die("--mtp-layers must be >= 0")
    if mtp_layers and not m.hybrid:
        die(f"{m.arch} has no MTP layer")
    if args.shard_size_gb <= 0:
        die("--shard-size-gb must be positive")
    if args.jobs < 1:
        die("--jobs must be >= 1")

    fmt = args.format
    experts_layout = args.experts or ("per-expert" if m.next else "fused")
    if fmt != "bf16" and args.experts == "fused":
        die(f"{fmt} routed experts are per expert (as the release); --experts applies to --format bf16")
    mtp_experts_layout = args.mtp_experts or ("per-expert" if fmt != "bf16" else experts_layout)
    if fmt == "fp8-block" and mtp_experts_layout == "fused":
        die("fp8-block MTP routed experts are FP8 per expert (as the release); --mtp-experts fused is BF16 only")
    if args.shared_expert and fmt != "nvfp4":
        die("--shared-expert applies to --format nvfp4 (nvfp4-v2 / nvfp4-mixed / fp8-block: FP8 shared expert)")
    shared_nvfp4 = fmt == "nvfp4" and (args.shared_expert or "nvfp4") == "nvfp4"
    return num_layers, mtp_layers, experts_layout, mtp_experts_layout, shared_nvfp4


def print_plan(cfg_path, m, fmt, num_layers, mtp_layers, experts_layout, mtp_experts_layout, tensors, shards,
               shard_size_gb):
    """The plan's summary on stderr; returns (tensor bytes, bytes the folder needs)."""
    total = sum(t.nbytes for t in tensors)
    by_dtype = {}
    for t in tensors:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
    mtp_bytes = sum(t.nbytes for t in tensors if t.group == "mtp")
    # Header size estimate: ~110 bytes per tensor entry; plus index + side files.
    side = sum(len(t.name) * 2 + 160 for t in tensors) + (12 << 20)
    need = total + side

    cut = f", cut to {num_layers}/{m.L} layers" if num_layers != m.L else ""
    experts_desc = {"nvfp4": "per-expert NVFP4", "nvfp4-v2": "per-expert NVFP4", "nvfp4-mixed": "per-expert NVFP4",
                    "fp8-block": "per-expert FP8"}.get(fmt, experts_layout)
    print(f"{os.path.relpath(cfg_path)}: {m.arch}, {fmt}{cut}, {mtp_layers} MTP layer(s), "
          f"experts {experts_desc} "
          f"(MTP {mtp_experts_layout} {'FP8' if fmt == 'fp8-block' else 'BF16'})", file=sys.stderr)
    print(f"total {gb(total)} ({total} bytes) in {len(tensors)} tensors, {len(shards)} shard(s) of <= "
          f"{shard_size_gb:g} GB; by dtype: " + ", ".join(f"{k} {gb(v)}" for k, v in sorted(by_dtype.items()))
          + f"; MTP {gb(mtp_bytes)}", file=sys.stderr)
    return total, need


def prepare_out_dir(out_dir, force, need):
    """Refuses a non-empty OUT_DIR without --force and a file system (or, on tmpfs, RAM) without room for
    `need` bytes; then creates OUT_DIR and, with --force, removes the files this tool writes."""
    existing = []
    if os.path.isdir(out_dir):
        existing = os.listdir(out_dir)
        if existing and not force:
            die(f"{out_dir} is not empty; use --force to replace the files this tool writes there")
    elif os.path.exists(out_dir):
        die(f"{out_dir} exists and is not a folder")
    reclaim = 0
    if force:
        for fn in existing:
            if ours(fn):
                reclaim += os.path.getsize(os.path.join(out_dir, fn))
    free, where = free_bytes(out_dir)
    margin = int(0.5e9 + 0.005 * need)
    if free + reclaim < need + margin:
        die(f"not enough disk space: {where} has {gb(free)} free"
            + (f" (+{gb(reclaim)} from files replaced)" if reclaim else "")
            + f", the checkpoint needs {gb(need)} (+{gb(margin)} margin). Free space, pick another folder, "
              f"or cut depth with --num-layers.")
    if memory_backed(where):
        avail = mem_available()
        if avail is not None and need + (2 << 30) > avail + reclaim:
            die(f"{where} is memory-backed (tmpfs) and the checkpoint ({gb(need)}) would not leave 2 GiB of the "
                f"{gb(avail)} of available RAM; pick a folder on disk")
    print(f"disk: {where} has {gb(free)} free, needs {gb(need)}", file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    if force:
        for fn in existing:
            if ours(fn):
                os.remove(os.path.join(out_dir, fn))


def write_shards(out_dir, shards, tensors, pools, total, args):
    """All shards, --jobs at a time; returns the header bytes written."""
    index_of = {t.name: i for i, t in enumerate(tensors)}
    header_bytes = 0
    with Progress(total, args.quiet) as prog:
        with ThreadPoolExecutor(max_workers=args.jobs) as ex:
            futs = [ex.submit(write_shard, os.path.join(out_dir, fn), ts, pools, args.seed, index_of, prog, args.fsync)
                    for fn, ts in shards]
            for fu in futs:
                header_bytes += fu.result()
    return header_bytes


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_side_files(out_dir, cfg, cfg_path, m, num_layers, mtp_layers, shared_nvfp4, planner, shards, total,
                     tok_dir, args):
    """The index, the quantization config(s), config.json, generation_config.json and the tokenizer;
    written after the shards so that a folder with an index is complete."""
    fmt = args.format
    weight_map = {t.name: fn for fn, ts in shards for t in ts}
    write_json(os.path.join(out_dir, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    quant_cfg, hf = None, None
    if fmt == "nvfp4":
        hf, quant_cfg = quant_files(m, mtp_layers, shared_nvfp4)
    elif fmt in MODELOPT_MIXED:
        hf, quant_cfg = mixed_quant_files(m, mtp_layers, fmt, planner.quantized_layers)
    elif fmt == "fp8-block":
        quant_cfg = fp8_block_quant_config(planner.bf16_modules)
    if hf is not None:
        write_json(os.path.join(out_dir, "hf_quant_config.json"), hf)
    src = os.path.abspath(cfg_path)
    src = os.path.relpath(src, REPO) if src.startswith(REPO + os.sep) else src
    write_json(os.path.join(out_dir, "config.json"),
               out_config(cfg, m, num_layers, args.mtp_layers, fmt, quant_cfg, src, args.seed))
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config(m))
    if tok_dir:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(tok_dir, fn)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(out_dir, fn))


def main(doc):
    """`doc`: tools/make_synthetic_checkpoint.py's docstring, whose first paragraph is --help's description."""
    args = parse_args(doc)
    cfg_path, out_dir = config_and_out(args)
    with open(cfg_path) as f:
        cfg = json.load(f)
    m = Model(cfg, cfg_path)
    num_layers, mtp_layers, experts_layout, mtp_experts_layout, shared_nvfp4 = choices(args, m)

    fmt = args.format
    sizes = pool_sizes(fmt)
    planner = Planner(m, fmt, np.random.default_rng(args.seed), sizes, experts_layout, mtp_experts_layout,
                      shared_nvfp4, "mtp")
    tensors = planner.build(num_layers, mtp_layers)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate tensor names in the plan")
    shards = pack_shards(tensors, int(args.shard_size_gb * 1e9), args.separate_mtp_file)
    total, need = print_plan(cfg_path, m, fmt, num_layers, mtp_layers, experts_layout, mtp_experts_layout, tensors,
                             shards, args.shard_size_gb)

    if args.dry_run:
        if args.list_tensors:
            for f_name, ts in shards:
                for t in ts:
                    print(f"{f_name}\t{t.name}\t{t.dtype}\t{list(t.shape)}")
        print(f"dry run: {m.arch} {fmt} layers={num_layers} mtp={mtp_layers} tensors={len(tensors)} "
              f"shards={len(shards)} total_bytes={total} ({gb(total)})")
        return

    prepare_out_dir(out_dir, args.force, need)
    tok_dir = find_tokenizer_dir()
    if tok_dir is None:
        print("warning: no Qwen3 tokenizer found (tests/fixtures/tokenizers/qwen3 or "
              "/work/shared/fixtures/tokenizers/qwen3); writing none", file=sys.stderr)

    t_pool = time.time()
    pools = make_pools(np.random.default_rng([args.seed, 2]), sizes)
    t_pool = time.time() - t_pool

    t0 = time.time()
    header_bytes = write_shards(out_dir, shards, tensors, pools, total, args)
    t_write = time.time() - t0
    write_side_files(out_dir, cfg, cfg_path, m, num_layers, mtp_layers, shared_nvfp4, planner, shards, total,
                     tok_dir, args)
    elapsed = time.time() - t0
    on_disk = total + header_bytes
    print(f"wrote {out_dir}: {m.arch} {fmt} layers={num_layers} mtp={mtp_layers} tensors={len(tensors)} "
          f"shards={len(shards)} {gb(on_disk)} in {t_write:.1f} s ({on_disk / max(t_write, 1e-9) / 1e9:.2f} GB/s"
          f"{', fsync' if args.fsync else ''}; pools {t_pool:.1f} s, total {elapsed + t_pool:.1f} s)")
