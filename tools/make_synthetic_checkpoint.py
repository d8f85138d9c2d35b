#!/usr/bin/env python3
"""Write a FULL-SIZE Hugging Face checkpoint folder with random weights, in the tensor layout of a real
release, from one of Fathom's configs (configs/*.json). For load, memory and throughput tests on big
machines without downloading a real checkpoint. The values are random (no golden outputs).

usage:
    make_synthetic_checkpoint.py [CONFIG] OUT_DIR [--config CONFIG]
                                 [--format nvfp4|bf16|nvfp4-v2|nvfp4-mixed|fp8-block]
                                 [--num-layers N] [--mtp-layers N] [--seed S] [--shard-size-gb 5]
                                 [--jobs J] [--dry-run [--list-tensors]] [--force] [--fsync]

    CONFIG is a path (configs/qwen3.5-35b-a3b.json) or a name from configs/ (qwen3.5-35b-a3b).

    make_synthetic_checkpoint.py configs/qwen3.5-35b-a3b.json /data/q35-nvfp4 --format nvfp4
    make_synthetic_checkpoint.py qwen3.5-35b-a3b /tmp/q35-l4 --format bf16 --num-layers 4
    make_synthetic_checkpoint.py qwen3.5-397b-a17b /tmp/x --dry-run        # sizes only
    make_synthetic_checkpoint.py qwen3.5-397b-a17b /data/v2 --format nvfp4-v2 --num-layers 12

Full-size totals (tensor bytes; GB = 1e9): 35B-A3B nvfp4 24.5, bf16 71.0; 122B-A10B nvfp4 81.9,
bf16 249.3; 397B-A17B nvfp4 249.1, bf16 805.9; Qwen3-Next-80B nvfp4 51.3, bf16 162.6 (all with the
MTP layer; --mtp-layers 0 saves 1.7 / 5.1 / 13.2 / 3.3 GB). The newer layouts: 397B-A17B nvfp4-v2
242.6, nvfp4-mixed 241.1, fp8-block 405.3; 35B-A3B nvfp4-v2 23.3, nvfp4-mixed 22.6, fp8-block 36.6;
122B-A10B nvfp4-v2 78.0, fp8-block 126.3; Qwen3-Next-80B nvfp4-v2 49.8, fp8-block 82.0 (with the MTP
layer: BF16 in the ModelOpt formats, 13.2 GB of it at 397B; FP8 in fp8-block, 6.6 GB at 397B).
397B nvfp4-v2 cut to --num-layers 12: 62.3 GB = 58.1 GiB, and the run asks for 63.2 GB free, so it
fits a 64 GiB disk with at most ~5 GB used by other things (11 layers 58.6 GB; 12 layers with
--mtp-layers 0 49.1 GB; 13 layers 66.1 GB need a nearly empty 64 GiB disk). The total is printed
first; the run is refused when the target file system lacks the space (or, on tmpfs, the RAM).
Measured: 35B nvfp4 (24.5 GB) in 5.6 s to the page cache + 6 s sync, 11.5 s with --fsync (2.1 GB/s)
on the H200 host.

Needs numpy and the standard library only (the safetensors files are written by hand: 8-byte
little-endian header length, JSON header with dtype/shape/data_offsets and
"__metadata__": {"format": "pt"}, padded with spaces to 8 bytes, then the raw bytes). Writing is
streamed: a shard is never held in memory. Speed: a few random pools (tens of MB) are drawn once and
every tensor is a slice of one of them at a random offset (wrapping around for tensors bigger than a
pool), so the run is disk-bound. Shards are written by --jobs threads in parallel, to *.tmp names that
are renamed when complete; the index and config files come last.

Layout (what the real releases hold, as far as shared/reference/ and the loader know):

  prefix     `model.language_model.` for Qwen3_5*ForConditionalGeneration (multimodal release; the
             vision tower `model.visual.*` is NOT written: our configs carry no vision_config),
             `model.` for *ForCausalLM (Qwen3-Next); `lm_head.weight` top level (untied); `mtp.*` top
             level (fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0 = full-attention MoE
             layer, norm).
  layer      input_layernorm / post_attention_layernorm; full attention: self_attn.{q_proj [2*nh*d, H]
             (query+gate per head), k_proj, v_proj, o_proj, q_norm, k_norm}; Gated DeltaNet:
             linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a} (Qwen3.5) or
             {in_proj_qkvz, in_proj_ba} (Qwen3-Next, grouped per key head), conv1d.weight [C,1,K],
             dt_bias (BF16), A_log (F32), norm.weight [dv], out_proj; MoE: mlp.gate.weight [E, H]
             (router), routed experts, mlp.shared_expert.{gate,up,down}_proj, mlp.shared_expert_gate
             [1, H].
  --format bf16   everything BF16 (A_log F32). Qwen3.5: FUSED routed experts, main model and MTP:
             `mlp.experts.gate_up_proj` [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up) and
             `mlp.experts.down_proj` [E, H, I] (no `.weight` suffix). Qwen3-Next: per expert
             `mlp.experts.{e}.{gate,up,down}_proj.weight` (that release is per expert).
  --format nvfp4  ModelOpt NVFP4 export (nvidia/Qwen3.5-*-NVFP4): routed experts AND the shared expert
             of every main layer are NVFP4 per module: `.weight` U8 [out, in/2] (two E2M1 codes per
             byte, random bytes), `.weight_scale` F8_E4M3 [out, in/16] (codes 0x68..0x7E = 64..448,
             never NaN), `.weight_scale_2` F32 [] (equal for gate/up of one expert), `.input_scale`
             F32 [] (one value per layer for all experts' gate/up, one for down: ModelOpt's fused
             expert export); dequant e2m1*scale*scale_2 has std ~0.02. Everything else BF16,
             including the router (mlp.gate), shared_expert_gate and the whole MTP block, whose
             routed experts are per expert BF16 `mtp.layers.0.mlp.experts.{e}.*_proj.weight`.
             hf_quant_config.json {"producer": {"name": "modelopt"}, "quantization": {"quant_algo":
             "NVFP4", "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": [...]}} and
             the same list as config.json quantization_config.ignore ("quant_method": "modelopt").
             exclude_modules = lm_head, <prefix>layers.*.linear_attn*, <prefix>layers.*.self_attn*,
             model.visual* (multimodal only), mtp.layers.0*; the router and mtp.fc are BF16 but NOT
             listed, like the real 397B export (vllm#35156, vllm#38832: "hf_quant_config.json only
             excludes mtp.layers.0*"); same list as tests/fixtures/qwen35_moe_nvfp4.
             Qwen3-Next additionally lists <prefix>layers.*.mlp.gate (its export does, vllm#35156).
  --format nvfp4-v2  ModelOpt MIXED_PRECISION (nvidia/Qwen3.5-397B-A17B-NVFP4-V2, Model-Optimizer PR 1868):
             routed experts NVFP4 per expert exactly as --format nvfp4 writes them; attention q/k/v/o,
             Gated DeltaNet in_proj_qkv, in_proj_z, out_proj (Qwen3-Next: in_proj_qkvz, out_proj) and the
             shared expert's gate/up/down FP8 per tensor (W8A8, static): `.weight` F8_E4M3 [out, in]
             (codes ~N(0, 80) rounded to E4M3 and clipped to +-448, never 0x7F/0xFF NaN), `.weight_scale`
             F32 [] (dequantized std ~0.02, i.e. ~amax/448) and `.input_scale` F32 [] (amax/448), the
             two shared by the modules that read one input (q/k/v, in_proj_qkv/z, shared gate/up: the
             export unifies their amax, as gate/up share weight_scale_2 in NVFP4); full-attention layers
             also `self_attn.k_proj.k_scale` and `self_attn.v_proj.v_scale` F32 [] (amax/448 clamped to
             >= 1.0, so mostly 1.0). A dense MLP (Qwen3 / Qwen3.5 dense configs) is NVFP4 like the
             experts. BF16: embeddings, norms, router, shared_expert_gate, in_proj_a/b (in_proj_ba),
             conv1d, dt_bias, lm_head and the whole MTP block (per-expert, as nvfp4); A_log F32.
             hf_quant_config.json {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization":
             {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8", "quantized_layers":
             {<module>: {"quant_algo": "FP8"} | {"quant_algo": "NVFP4", "group_size": 16}},
             "exclude_modules": [...]}}: module names with the release prefix
             (model.language_model.layers.N.linear_attn.in_proj_qkv, ...), the routed experts ONE entry
             per layer `<prefix>layers.N.mlp.experts` (the tensors are `.experts.{e}.*_proj.*`);
             exclude_modules = lm_head, <prefix>layers.*.mlp.gate, ...mlp.shared_expert_gate,
             ...linear_attn.in_proj_a/b (in_proj_ba), ...linear_attn.conv1d, model.visual* (multimodal),
             mtp.fc, mtp.layers.N*. config.json quantization_config mirrors it: {"quant_method":
             "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
             "kv_cache_scheme": {8-bit float}, "quantized_layers": ..., "ignore": <exclude_modules>,
             "producer": ..., "config_groups": {FP8 group, NVFP4 group, with the module names as targets}}.
  --format nvfp4-mixed  as nvfp4-v2 (nvidia/Qwen3.6-35B-A3B-NVFP4 style) but the lm_head is W4A16 NVFP4
             (weight only): `lm_head.weight` U8 [V, H/2], `.weight_scale` F8_E4M3 [V, H/16],
             `.weight_scale_2` F32 [], NO input_scale; quantized_layers "lm_head": {"quant_algo":
             "W4A16_NVFP4", "group_size": 16} (a weights-only third config group), lm_head not excluded.
             As in that release (sglang#27906) the FP8 KV-cache setting is in hf_quant_config.json only:
             config.json's quantization_config has no kv_cache_quant_algo / kv_cache_scheme.
  --format fp8-block  Qwen's own -FP8 releases (Qwen3.6-35B-A3B-FP8, Qwen3-Next FP8): 128x128 block
             FP8, no hf_quant_config.json. FP8: attention q/k/v/o, GDN in_proj_qkv/in_proj_z/out_proj
             (in_proj_qkvz), shared expert gate/up/down, routed experts PER EXPERT
             `mlp.experts.{e}.{gate,up,down}_proj`, and all of these in the MTP layer too (its experts per
             expert): `.weight` F8_E4M3 [out, in] (codes as above) + `.weight_scale_inv` F32
             [ceil(out/128), ceil(in/128)] (dequant = code x its block's value; values ~ std 0.02 / code
             rms, log-normal jitter). BF16 the rest: embeddings, lm_head, norms, router, shared_expert_gate,
             in_proj_a/b (in_proj_ba), conv1d, dt_bias, mtp.fc; A_log F32. config.json quantization_config
             {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size":
             [128, 128], "modules_to_not_convert": [every BF16 module with a matrix weight, by full name:
             <prefix>embed_tokens, <prefix>layers.N.linear_attn.{in_proj_b,in_proj_a,conv1d},
             <prefix>layers.N.mlp.{gate,shared_expert_gate}, lm_head, mtp.fc, mtp.layers.0.mlp.gate, ...]}
             (names no FP8 module contains as a substring, for transformers' substring match).

Values: BF16 matrices N(0, 0.02); zero-centred RMSNorm weights (Qwen3.5/Qwen3-Next apply 1 + w) are
N(0, 0.02) around 0, i.e. gains ~1.0; the Gated DeltaNet norm (plain w) and Qwen3 dense norms ~1.0;
A_log = log(U(1, 16)); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1] (transformers' init);
conv1d U(-0.5, 0.5); NVFP4 and FP8 as above (the FP8 pools are drawn after the others and only for
the formats that use them, so nvfp4 / bf16 output is unchanged by their addition). Output is
deterministic for a given --seed and --jobs-independent.

MTP: written when the config declares it (mtp_num_hidden_layers / num_nextn_predict_layers); for
Qwen3-Next, whose release ships mtp.* without declaring it, one layer is written and the config is
left as it is (so Fathom ignores it). --mtp-layers N overrides and then declares N in config.json.
config.json is the input config with num_hidden_layers / layer_types cut by --num-layers, a
"_comment" naming the source, and quantization_config for the quantized formats. generation_config.json has the
Qwen3.5 (or Qwen3) special ids; the tokenizer is Qwen3's (tests/fixtures/tokenizers/qwen3, else
/work/shared/fixtures/tokenizers/qwen3): 151k tokens, fine for token-id prompts, not Qwen3.5's vocabulary.
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SEED = 20250611
DTYPE_SIZE = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
WEIGHT_STD = 0.02
NORM_STD = 0.02
POOL_BF16_BYTES = 64 << 20
POOL_U8_BYTES = 64 << 20
POOL_E4M3_BYTES = 8 << 20
POOL_FP8W_BYTES = 16 << 20   # FP8 weight codes (nvfp4-v2 / nvfp4-mixed / fp8-block only)
POOL_F32S_BYTES = 4 << 20    # FP8 block scales, F32 (fp8-block only)
E4M3_CODES = np.arange(0x68, 0x7F, dtype=np.uint8)  # 64 .. 448; 0x7F (NaN) excluded
FP8_CODE_STD = 80.0          # FP8 weight codes ~ N(0, 80) rounded to E4M3, clipped to +-448 (amax ~ 5 sigma)
FP8_BLOCK = 128
FORMATS = ("nvfp4", "bf16", "nvfp4-v2", "nvfp4-mixed", "fp8-block")
MODELOPT_MIXED = ("nvfp4-v2", "nvfp4-mixed")
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
GROUP = 16

ARCHS = {  # architectures[0] -> (family, multimodal)
    "Qwen3ForCausalLM": ("qwen3", False),
    "Qwen3NextForCausalLM": ("qwen3_next", False),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", True),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", False),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", True),
    "Qwen3_5ForCausalLM": ("qwen3_5", False),
}


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def gb(n):
    return f"{n / 1e9:.2f} GB"


# --------------------------------------------------------------------------------------------
# Tensor plan
# --------------------------------------------------------------------------------------------


class T:
    """One tensor to write: name, dtype, shape, and how to fill it.

    kind: 'pool_bf16' | 'pool_u8' | 'pool_e4m3' (slice of a random pool at `arg` = start offset),
          'scalar' (F32 value `arg`), 'small' (generated from rule `arg` at write time)."""

    __slots__ = ("name", "dtype", "shape", "kind", "arg", "nbytes", "group")

    def __init__(self, name, dtype, shape, kind, arg=None, group="model"):
        self.name, self.dtype, self.shape, self.kind, self.arg, self.group = name, dtype, tuple(shape), kind, arg, group
        self.nbytes = math.prod(self.shape) * DTYPE_SIZE[dtype]


class Model:
    """Model dimensions read from a config.json (nested text_config or flat)."""

    def __init__(self, cfg, path):
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in ARCHS:
            die(f"{path}: architectures {archs} not supported (supported: {', '.join(ARCHS)})")
        self.arch = archs[0]
        self.family, self.multimodal = ARCHS[self.arch]
        t = cfg.get("text_config") or cfg
        self.text = t
        g = lambda k, d=None: t.get(k, d) if t.get(k) is not None else d  # noqa: E731
        self.prefix = "model.language_model." if self.multimodal else "model."
        self.H = t["hidden_size"]
        self.L = t["num_hidden_layers"]
        self.V = t["vocab_size"]
        self.nh = t["num_attention_heads"]
        qwen3 = self.family == "qwen3"
        self.nkv = g("num_key_value_heads", self.nh if qwen3 else 2)
        self.d = g("head_dim", self.H // self.nh if qwen3 else 256)
        self.gated_attn = False if qwen3 else bool(g("attn_output_gate", True))
        self.zero_centred = not qwen3
        self.hybrid = not qwen3
        self.moe = self.family in ("qwen3_5_moe", "qwen3_next")
        self.next = self.family == "qwen3_next"
        self.inter = g("intermediate_size", 0)
        self.E = g("num_experts", 0) if self.moe else 0
        self.I = g("moe_intermediate_size", 0)
        self.S = g("shared_expert_intermediate_size", 512) if self.moe else 0
        self.mlp_only = set(g("mlp_only_layers", []) or []) if self.next else set()
        self.sparse_step = g("decoder_sparse_step", 1) if self.next else 1
        self.hk = g("linear_num_key_heads", 16)
        self.hv = g("linear_num_value_heads", 32)
        self.dk = g("linear_key_head_dim", 128)
        self.dv = g("linear_value_head_dim", 128)
        self.kc = g("linear_conv_kernel_dim", 4)
        top_tie = cfg.get("tie_word_embeddings")
        self.tied = bool(top_tie if top_tie is not None else t.get("tie_word_embeddings", False))
        lt = t.get("layer_types")
        if lt:
            self.layer_types = ["full_attention" if x in ("full_attention", "attention") else "linear_attention"
                                for x in lt]
        elif self.hybrid:
            iv = g("full_attention_interval", 4)
            self.layer_types = ["full_attention" if (i + 1) % iv == 0 else "linear_attention" for i in range(self.L)]
        else:
            self.layer_types = ["full_attention"] * self.L
        if len(self.layer_types) != self.L:
            die(f"{path}: layer_types has {len(self.layer_types)} entries, num_hidden_layers is {self.L}")
        mtp = t.get("mtp_num_hidden_layers")
        if mtp is None:
            mtp = t.get("num_nextn_predict_layers")
        if mtp is None and t is not cfg:
            mtp = cfg.get("mtp_num_hidden_layers")
        self.mtp_declared = mtp
        # The Qwen3-Next release ships one MTP layer (mtp.*) although its config declares none.
        self.mtp = int(mtp) if mtp is not None else (1 if self.next else 0)

    def is_moe_layer(self, i):
        if not self.moe:
            return False
        if self.next:
            return i not in self.mlp_only and (i + 1) % self.sparse_step == 0
        return True


class Planner:
    def __init__(self, m, fmt, rng, pool_sizes, experts_layout, mtp_experts_layout, shared_nvfp4, mtp_group):
        self.m, self.fmt, self.rng = m, fmt, rng
        self.pool_sizes = pool_sizes
        self.experts_layout = experts_layout
        self.mtp_experts_layout = mtp_experts_layout
        self.shared_nvfp4 = shared_nvfp4
        self.mtp_group = mtp_group
        self.out = []
        self.group = "model"
        # nvfp4-v2 / nvfp4-mixed / fp8-block: what the quantization configs list (module -> algo, in plan
        # order) and the BF16 modules that own a `.weight` (fp8-block modules_to_not_convert).
        self.quantized_layers = {}
        self.bf16_modules = []
        self.kv_scales = fmt in MODELOPT_MIXED
        if fmt in MODELOPT_MIXED + ("fp8-block",):
            # Per-tensor FP8 weight_scale giving a dequantized std of WEIGHT_STD (the block scales of
            # fp8-block, pool_f32s, are centred on the same value).
            self.fp8_scale_base = WEIGHT_STD / fp8_code_rms()
        # NVFP4 global scale giving a dequantized std of WEIGHT_STD for uniform random E2M1 codes and
        # block scales drawn uniformly from E4M3_CODES.
        sv = e4m3_to_f32(E4M3_CODES)
        rms_codes = math.sqrt(float(np.mean(E2M1_VALUES ** 2)))
        self.scale2_base = WEIGHT_STD / (rms_codes * math.sqrt(float(np.mean(sv ** 2))))

    # -- primitives
    def _off(self, kind, nbytes, align):
        p = self.pool_sizes[kind]
        return int(self.rng.integers(0, p // align)) * align

    def bf16(self, name, shape):
        t = T(name, "BF16", shape, "pool_bf16", None, self.group)
        t.arg = self._off("pool_bf16", t.nbytes, 2)
        self.out.append(t)
        if name.endswith(".weight"):
            self.bf16_modules.append(name[:-len(".weight")])

    def small(self, name, dtype, shape, rule):
        self.out.append(T(name, dtype, shape, "small", rule, self.group))

    def norm(self, name, n, plain=False):
        self.small(name, "BF16", (n,), "norm1" if (plain or not self.m.zero_centred) else "norm0")

    def scalar(self, name, value):
        self.out.append(T(name, "F32", (), "scalar", float(value), self.group))

    def nvfp4(self, module, out, inp, scale_2, input_scale):
        if inp % GROUP:
            die(f"{module}: input size {inp} is not a multiple of {GROUP}")
        w = T(module + ".weight", "U8", (out, inp // 2), "pool_u8", None, self.group)
        w.arg = self._off("pool_u8", w.nbytes, 1)
        s = T(module + ".weight_scale", "F8_E4M3", (out, inp // GROUP), "pool_e4m3", None, self.group)
        s.arg = self._off("pool_e4m3", s.nbytes, 1)
        self.out += [w, s]
        self.scalar(module + ".weight_scale_2", scale_2)
        if input_scale is not None:
            self.scalar(module + ".input_scale", input_scale)

    def fp8_tensor(self, module, out, inp, weight_scale, input_scale):
        """ModelOpt FP8 (W8A8, per tensor): weight E4M3 [out, in], weight_scale / input_scale F32 []."""
        w = T(module + ".weight", "F8_E4M3", (out, inp), "pool_fp8w", None, self.group)
        w.arg = self._off("pool_fp8w", w.nbytes, 1)
        self.out.append(w)
        self.scalar(module + ".weight_scale", weight_scale)
        self.scalar(module + ".input_scale", input_scale)
        self.quantized_layers[module] = {"quant_algo": "FP8"}

    def fp8_block(self, module, out, inp):
        """Block FP8 (Qwen -FP8): weight E4M3 [out, in], weight_scale_inv F32 [ceil(out/128), ceil(in/128)]."""
        w = T(module + ".weight", "F8_E4M3", (out, inp), "pool_fp8w", None, self.group)
        w.arg = self._off("pool_fp8w", w.nbytes, 1)
        s = T(module + ".weight_scale_inv", "F32", (-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)), "pool_f32s", None,
              self.group)
        s.arg = self._off("pool_f32s", s.nbytes, 4)
        self.out += [w, s]

    def fp8_jitter(self):
        return self.fp8_scale_base * float(np.exp(self.rng.normal(0.0, 0.15)))

    def fp8_input_scale(self):
        return float(self.rng.uniform(2.0, 20.0)) / 448.0  # calibrated amax / 448

    def proj_group(self, modules, mtp):
        """Linears of one sublayer that read the same input (q/k/v; GDN qkv/z; gate/up), each (name, out, in).
        Format by --format; ModelOpt FP8 members share weight_scale and input_scale (its export unifies the
        amax of modules fused by engines), like gate/up sharing weight_scale_2 in NVFP4."""
        if self.fmt == "fp8-block":
            for name, out, inp in modules:
                self.fp8_block(name, out, inp)
        elif self.fmt in MODELOPT_MIXED and not mtp:
            ws, ins = self.fp8_jitter(), self.fp8_input_scale()
            for name, out, inp in modules:
                self.fp8_tensor(name, out, inp, ws, ins)
        else:
            for name, out, inp in modules:
                self.bf16(name + ".weight", (out, inp))

    def kv_scale(self):
        # amax/448 of post-RoPE keys / values, clamped to >= 1.0 for an FP8 KV cache (ModelOpt
        # postprocess_state_dict): mostly 1.0, some above.
        return max(1.0, float(self.rng.uniform(100.0, 900.0)) / 448.0)

    def jitter(self):
        return self.scale2_base * float(np.exp(self.rng.normal(0.0, 0.15)))

    def input_scale(self):
        return float(self.rng.uniform(2.0, 20.0)) / (6.0 * 448.0)  # calibrated amax / (6 * 448)

    def linear(self, module, out, inp, quant):
        if quant:
            self.nvfp4(module, out, inp, self.jitter(), self.input_scale())
        else:
            self.bf16(module + ".weight", (out, inp))

    def mlp(self, p, inter, quant, mtp=False, shared=False):
        H = self.m.H
        if self.fmt in MODELOPT_MIXED + ("fp8-block",):
            if self.fmt in MODELOPT_MIXED and not mtp and not shared:  # dense MLP: NVFP4 like the experts
                s2, ins = self.jitter(), self.input_scale()
                for proj, o, i, a, b in (("gate_proj", inter, H, s2, ins), ("up_proj", inter, H, s2, ins),
                                         ("down_proj", H, inter, self.jitter(), self.input_scale())):
                    self.nvfp4(f"{p}.{proj}", o, i, a, b)
                    self.quantized_layers[f"{p}.{proj}"] = {"quant_algo": "NVFP4", "group_size": GROUP}
                return
            self.proj_group([(p + ".gate_proj", inter, H), (p + ".up_proj", inter, H)], mtp)
            self.proj_group([(p + ".down_proj", H, inter)], mtp)
            return
        if quant:
            s2, ins = self.jitter(), self.input_scale()
            self.nvfp4(p + ".gate_proj", inter, H, s2, ins)
            self.nvfp4(p + ".up_proj", inter, H, s2, ins)
            self.nvfp4(p + ".down_proj", H, inter, self.jitter(), self.input_scale())
        else:
            self.bf16(p + ".gate_proj.weight", (inter, H))
            self.bf16(p + ".up_proj.weight", (inter, H))
            self.bf16(p + ".down_proj.weight", (H, inter))

    # -- blocks
    def attention(self, p, mtp=False):
        m = self.m
        if self.fmt in MODELOPT_MIXED + ("fp8-block",):
            self.proj_group([(p + ".q_proj", m.nh * m.d * (2 if m.gated_attn else 1), m.H),
                             (p + ".k_proj", m.nkv * m.d, m.H), (p + ".v_proj", m.nkv * m.d, m.H)], mtp)
            self.proj_group([(p + ".o_proj", m.H, m.nh * m.d)], mtp)
            if self.kv_scales and not mtp:
                self.scalar(p + ".k_proj.k_scale", self.kv_scale())
                self.scalar(p + ".v_proj.v_scale", self.kv_scale())
        else:
            self.bf16(p + ".q_proj.weight", (m.nh * m.d * (2 if m.gated_attn else 1), m.H))
            self.bf16(p + ".k_proj.weight", (m.nkv * m.d, m.H))
            self.bf16(p + ".v_proj.weight", (m.nkv * m.d, m.H))
            self.bf16(p + ".o_proj.weight", (m.H, m.nh * m.d))
        self.norm(p + ".q_norm.weight", m.d)
        self.norm(p + ".k_norm.weight", m.d)

    def gated_delta_net(self, p):
        m = self.m
        kd, vd = m.hk * m.dk, m.hv * m.dv
        conv = 2 * kd + vd
        if m.next:
            self.proj_group([(p + ".in_proj_qkvz", 2 * kd + 2 * vd, m.H)], False)
            self.bf16(p + ".in_proj_ba.weight", (2 * m.hv, m.H))
        else:
            self.proj_group([(p + ".in_proj_qkv", conv, m.H), (p + ".in_proj_z", vd, m.H)], False)
            self.bf16(p + ".in_proj_b.weight", (m.hv, m.H))
            self.bf16(p + ".in_proj_a.weight", (m.hv, m.H))
        self.small(p + ".conv1d.weight", "BF16", (conv, 1, m.kc), "conv")
        self.bf16_modules.append(p + ".conv1d")
        self.small(p + ".dt_bias", "BF16", (m.hv,), "dt_bias")
        self.small(p + ".A_log", "F32", (m.hv,), "a_log")
        self.norm(p + ".norm.weight", m.dv, plain=True)
        self.proj_group([(p + ".out_proj", m.H, vd)], False)

    def routed_experts(self, p, layout, quant):
        m = self.m
        E, I, H = m.E, m.I, m.H
        if layout == "fused":
            assert not quant
            self.bf16(p + ".gate_up_proj", (E, 2 * I, H))
            self.bf16(p + ".down_proj", (E, H, I))
            return
        if quant == "fp8-block":
            for e in range(E):
                q = f"{p}.{e}"
                self.fp8_block(q + ".gate_proj", I, H)
                self.fp8_block(q + ".up_proj", I, H)
                self.fp8_block(q + ".down_proj", H, I)
            return
        if quant:
            # ModelOpt fused-expert export: one input amax per projection for all experts of the
            # layer; gate and up of one expert share weight_scale_2.
            in_gu, in_d = self.input_scale(), self.input_scale()
            for e in range(E):
                q = f"{p}.{e}"
                s2 = self.jitter()
                self.nvfp4(q + ".gate_proj", I, H, s2, in_gu)
                self.nvfp4(q + ".up_proj", I, H, s2, in_gu)
                self.nvfp4(q + ".down_proj", H, I, self.jitter(), in_d)
            if self.fmt in MODELOPT_MIXED:
                self.quantized_layers[p] = {"quant_algo": "NVFP4", "group_size": GROUP}
        else:
            for e in range(E):
                q = f"{p}.{e}"
                self.bf16(q + ".gate_proj.weight", (I, H))
                self.bf16(q + ".up_proj.weight", (I, H))
                self.bf16(q + ".down_proj.weight", (H, I))

    def layer(self, p, full_attention, is_moe, mtp):
        m = self.m
        if self.fmt == "fp8-block":
            quant = "fp8-block"  # the MTP layer too
        elif self.fmt in MODELOPT_MIXED:
            quant = not mtp      # routed experts NVFP4; the projections FP8 (proj_group); MTP all BF16
        else:
            quant = self.fmt == "nvfp4" and not mtp
        self.norm(p + ".input_layernorm.weight", m.H)
        self.norm(p + ".post_attention_layernorm.weight", m.H)
        if full_attention:
            self.attention(p + ".self_attn", mtp)
        else:
            self.gated_delta_net(p + ".linear_attn")
        if is_moe:
            self.bf16(p + ".mlp.gate.weight", (m.E, m.H))
            layout = self.mtp_experts_layout if mtp else ("per-expert" if quant else self.experts_layout)
            self.routed_experts(p + ".mlp.experts", layout, quant)
            if m.S > 0:
                if self.fmt in MODELOPT_MIXED + ("fp8-block",):
                    self.mlp(p + ".mlp.shared_expert", m.S, False, mtp, shared=True)
                else:
                    self.mlp(p + ".mlp.shared_expert", m.S, quant and self.shared_nvfp4)
                self.bf16(p + ".mlp.shared_expert_gate.weight", (1, m.H))
        else:
            self.mlp(p + ".mlp", m.inter, quant, mtp)

    def build(self, num_layers, mtp_layers):
        m = self.m
        P = m.prefix
        self.bf16(P + "embed_tokens.weight", (m.V, m.H))
        for i in range(num_layers):
            self.layer(f"{P}layers.{i}", m.layer_types[i] == "full_attention", m.is_moe_layer(i), mtp=False)
        self.norm(P + "norm.weight", m.H)
        if not m.tied:
            if self.fmt == "nvfp4-mixed":
                # W4A16 NVFP4 (weight only): no input_scale.
                self.nvfp4("lm_head", m.V, m.H, self.jitter(), None)
                self.quantized_layers["lm_head"] = {"quant_algo": "W4A16_NVFP4", "group_size": GROUP}
            else:
                self.bf16("lm_head.weight", (m.V, m.H))
        if mtp_layers:
            self.group = self.mtp_group
            self.bf16("mtp.fc.weight", (m.H, 2 * m.H))
            self.norm("mtp.pre_fc_norm_embedding.weight", m.H)
            self.norm("mtp.pre_fc_norm_hidden.weight", m.H)
            for j in range(mtp_layers):
                self.layer(f"mtp.layers.{j}", True, m.moe, mtp=True)
            self.norm("mtp.norm.weight", m.H)
            self.group = "model"
        return self.out


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def e4m3_to_f32(codes):
    c = codes.astype(np.int32)
    e, mant = (c >> 3) & 0xF, c & 7
    v = np.where(e == 0, mant / 8.0 * 2.0 ** -6, (1 + mant / 8.0) * 2.0 ** (e - 7.0))
    return np.where(c & 0x80, -v, v)


def fp8_positive_table():
    """Finite non-negative E4M3 codes 0x00..0x7E (value increases with the code) and their values."""
    codes = np.arange(0x00, 0x7F, dtype=np.uint8)
    return codes, e4m3_to_f32(codes)


def fp8_code_rms():
    """RMS of the decoded FP8 weight codes of pool_fp8w: N(0, FP8_CODE_STD) rounded to the nearest
    E4M3 value, clipped to +-448 (exact, from the normal CDF, so that the plan needs no pool)."""
    _, vals = fp8_positive_table()
    mids = (vals[1:] + vals[:-1]) / 2
    cdf = lambda x: 0.5 * math.erfc(-x / (FP8_CODE_STD * math.sqrt(2)))  # noqa: E731
    edges = [0.0] + [float(x) for x in mids] + [math.inf]
    # P(|x| in [edges[i], edges[i+1])) = 2 (cdf(hi) - cdf(lo))
    ms = sum(2 * (cdf(hi) - cdf(lo)) * float(v) ** 2 for lo, hi, v in zip(edges[:-1], edges[1:], vals))
    return math.sqrt(ms)


def fp8_weight_codes(rng, n):
    """n FP8 E4M3 weight codes ~ N(0, FP8_CODE_STD) rounded to nearest, clipped to +-448: never NaN."""
    codes, vals = fp8_positive_table()
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    x = rng.standard_normal(n, dtype=np.float32) * np.float32(FP8_CODE_STD)
    out = codes[np.searchsorted(mids, np.abs(x))]
    out |= (x < 0).astype(np.uint8) << np.uint8(7)
    return out


def make_pools(rng, sizes):
    pools = {}
    n = sizes["pool_bf16"] // 2
    pools["pool_bf16"] = f32_to_bf16_bits(rng.standard_normal(n, dtype=np.float32) * np.float32(WEIGHT_STD))
    pools["pool_u8"] = np.frombuffer(rng.bytes(sizes["pool_u8"]), dtype=np.uint8)
    pools["pool_e4m3"] = rng.choice(E4M3_CODES, size=sizes["pool_e4m3"])
    # The FP8 formats' pools come after (and only when asked for): the others' output is unchanged.
    if "pool_fp8w" in sizes:
        pools["pool_fp8w"] = fp8_weight_codes(rng, sizes["pool_fp8w"])
    if "pool_f32s" in sizes:
        base = WEIGHT_STD / fp8_code_rms()
        v = base * np.exp(rng.normal(0.0, 0.15, sizes["pool_f32s"] // 4))
        pools["pool_f32s"] = v.astype("<f4")
    return {k: memoryview(v).cast("B") for k, v in pools.items()}


def small_values(t, seed, index):
    """Bytes of a small tensor (norms, conv, A_log, dt_bias), from its own RNG stream."""
    rng = np.random.default_rng([seed, 1, index])
    n = math.prod(t.shape)
    if t.arg == "norm0":
        v = rng.standard_normal(n) * NORM_STD
    elif t.arg == "norm1":
        v = 1.0 + rng.standard_normal(n) * NORM_STD
    elif t.arg == "conv":
        v = rng.uniform(-0.5, 0.5, n)
    elif t.arg == "a_log":
        v = np.log(rng.uniform(1.0, 16.0, n))
    elif t.arg == "dt_bias":
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.1), n))
        v = dt + np.log(-np.expm1(-dt))  # inverse softplus
    else:
        raise ValueError(t.arg)
    if t.dtype == "F32":
        return v.astype("<f4").tobytes()
    return f32_to_bf16_bits(v).astype("<u2").tobytes()


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


class Progress:
    def __init__(self, total, quiet=False):
        self.total, self.done, self.quiet = total, 0, quiet
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.stop = threading.Event()
        self.tty = sys.stderr.isatty()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def add(self, n):
        with self.lock:
            self.done += n

    def line(self):
        dt = max(time.time() - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return (f"  {self.done / 1e9:7.2f} / {self.total / 1e9:.2f} GB ({pct:5.1f}%)  {rate / 1e9:5.2f} GB/s  "
                f"elapsed {dt:6.1f} s  eta {eta:6.1f} s")

    def _run(self):
        period = 1.0 if self.tty else 5.0
        while not self.stop.wait(period):
            if not self.quiet:
                print(("\r" if self.tty else "") + self.line(), end="" if self.tty else "\n", file=sys.stderr,
                      flush=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        if not self.quiet:
            print(("\r" if self.tty else "") + self.line(), file=sys.stderr, flush=True)


CHUNK = 32 << 20


def write_shard(path, tensors, pools, seed, index_of, progress, fsync):
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb", buffering=4 << 20) as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        pending = 0
        for t in tensors:
            if t.kind == "scalar":
                f.write(struct.pack("<f", t.arg))
            elif t.kind == "small":
                f.write(small_values(t, seed, index_of[t.name]))
            else:
                pool = pools[t.kind]
                P, start, n = len(pool), t.arg, t.nbytes
                while n > 0:
                    k = min(n, P - start, CHUNK)
                    f.write(pool[start:start + k])
                    n -= k
                    start = 0 if start + k >= P else start + k
                    if k >= (1 << 20):
                        progress.add(k)
                    else:
                        pending += k
            if t.kind in ("scalar", "small"):
                pending += t.nbytes
            if pending >= (8 << 20):
                progress.add(pending)
                pending = 0
        progress.add(pending)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    expected = 8 + len(hb) + off
    actual = os.path.getsize(tmp)
    if actual != expected:
        raise RuntimeError(f"{tmp}: wrote {actual} bytes, expected {expected}")
    os.replace(tmp, path)
    return 8 + len(hb)


def pack_shards(tensors, shard_bytes, separate_mtp):
    """Greedy packing in plan order; a tensor bigger than the limit gets a shard of its own.
    Returns [(filename, [T...])]; tensors inside a shard sorted by dtype size (alignment)."""
    groups = {"model": [], "mtp": []}
    for t in tensors:
        groups["mtp" if (separate_mtp and t.group == "mtp") else "model"].append(t)
    shards, cur, cur_b = [], [], 0
    for t in groups["model"]:
        if cur and cur_b + t.nbytes > shard_bytes:
            shards.append(cur)
            cur, cur_b = [], 0
        cur.append(t)
        cur_b += t.nbytes
    if cur:
        shards.append(cur)
    n = len(shards)
    out = [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]
    if groups["mtp"]:
        out.append(("mtp.safetensors", groups["mtp"]))
    order = {t.name: i for i, t in enumerate(tensors)}
    return [(f, sorted(s, key=lambda t: (-DTYPE_SIZE[t.dtype], order[t.name]))) for f, s in out]


# --------------------------------------------------------------------------------------------
# Side files
# --------------------------------------------------------------------------------------------


def exclude_modules(m, mtp_layers, shared_nvfp4):
    P = m.prefix
    ex = ["lm_head", f"{P}layers.*.linear_attn*", f"{P}layers.*.self_attn*"]
    if m.next:
        ex.append(f"{P}layers.*.mlp.gate")
    if m.moe and not shared_nvfp4:
        ex.append(f"{P}layers.*.mlp.shared_expert*")
    if m.multimodal:
        ex.append("model.visual*")
    ex += [f"mtp.layers.{j}*" for j in range(mtp_layers)]
    return ex


def quant_files(m, mtp_layers, shared_nvfp4):
    producer = {"name": "modelopt", "version": "0.x"}
    ex = exclude_modules(m, mtp_layers, shared_nvfp4)
    hf = {"producer": producer,
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": GROUP,
                           "exclude_modules": ex}}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}
    qc = {"config_groups": {"group_0": {"input_activations": dict(fp4), "weights": dict(fp4), "targets": ["Linear"]}},
          "ignore": ex, "quant_algo": "NVFP4", "kv_cache_scheme": None, "producer": producer,
          "quant_method": "modelopt"}
    return hf, qc


MODELOPT_MIXED_VERSION = "0.37.0"


def mixed_exclude_modules(m, mtp_layers, fmt):
    """BF16 modules of the ModelOpt MIXED_PRECISION formats, as patterns (exclude_modules / ignore)."""
    P = m.prefix
    ex = [] if fmt == "nvfp4-mixed" else ["lm_head"]
    if m.moe:
        ex.append(f"{P}layers.*.mlp.gate")
        if m.S > 0:
            ex.append(f"{P}layers.*.mlp.shared_expert_gate")
    if m.hybrid:
        ex += ([f"{P}layers.*.linear_attn.in_proj_ba"] if m.next
               else [f"{P}layers.*.linear_attn.in_proj_a", f"{P}layers.*.linear_attn.in_proj_b"])
        ex.append(f"{P}layers.*.linear_attn.conv1d")
    if m.multimodal:
        ex.append("model.visual*")
    if mtp_layers:
        ex.append("mtp.fc")
    ex += [f"mtp.layers.{j}*" for j in range(mtp_layers)]
    return ex


def mixed_quant_files(m, mtp_layers, fmt, quantized_layers):
    """hf_quant_config.json and config.json quantization_config of nvfp4-v2 / nvfp4-mixed."""
    producer = {"name": "modelopt", "version": MODELOPT_MIXED_VERSION}
    ex = mixed_exclude_modules(m, mtp_layers, fmt)
    hf = {"producer": producer,
          "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                           "quantized_layers": quantized_layers, "exclude_modules": ex}}
    fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}
    by_algo = {}
    for mod, q in quantized_layers.items():
        by_algo.setdefault(q["quant_algo"], []).append(mod)
    groups = {}
    if "FP8" in by_algo:
        groups[f"group_{len(groups)}"] = {"input_activations": dict(fp8), "weights": dict(fp8),
                                          "targets": by_algo["FP8"]}
    if "NVFP4" in by_algo:
        groups[f"group_{len(groups)}"] = {"input_activations": dict(fp4), "weights": dict(fp4),
                                          "targets": by_algo["NVFP4"]}
    if "W4A16_NVFP4" in by_algo:
        groups[f"group_{len(groups)}"] = {"weights": dict(fp4), "targets": by_algo["W4A16_NVFP4"]}
    qc = {"config_groups": groups, "ignore": ex, "quant_algo": "MIXED_PRECISION", "producer": producer,
          "quant_method": "modelopt", "quantized_layers": quantized_layers}
    if fmt == "nvfp4-v2":
        qc["kv_cache_quant_algo"] = "FP8"
        qc["kv_cache_scheme"] = dict(fp8)
    # nvfp4-mixed (Qwen3.6-35B-A3B-NVFP4): the FP8 KV-cache setting is only in hf_quant_config.json
    # (sglang#27906), so a reader has to read both files.
    return hf, qc


def fp8_block_quant_config(bf16_modules):
    """config.json quantization_config of Qwen's -FP8 releases (no hf_quant_config.json)."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "modules_to_not_convert": list(bf16_modules)}


def generation_config(m):
    qwen35_vocab = m.V > 248046
    end, im_end = (248044, 248046) if qwen35_vocab else (151643, 151645)
    g = {"bos_token_id": end, "pad_token_id": end, "eos_token_id": [im_end, end], "do_sample": True}
    if m.family in ("qwen3_5_moe", "qwen3_5"):
        g.update(temperature=0.6, top_k=20, top_p=0.95)
    else:
        g.update(temperature=0.7, top_k=20, top_p=0.8)
    return g


def out_config(cfg, m, num_layers, mtp_override, fmt, quant_cfg, src, seed):
    c = json.loads(json.dumps(cfg))
    t = c.get("text_config") or c
    t["num_hidden_layers"] = num_layers
    if mtp_override is not None and mtp_override != m.mtp_declared:
        # Declare what was written, so the loader neither expects missing mtp.* tensors nor ignores them.
        t["num_nextn_predict_layers" if m.next else "mtp_num_hidden_layers"] = mtp_override
    if t.get("layer_types"):
        t["layer_types"] = t["layer_types"][:num_layers]
    if m.next and t.get("mlp_only_layers"):
        t["mlp_only_layers"] = [i for i in t["mlp_only_layers"] if i < num_layers]
    c["_comment"] = (f"SYNTHETIC random weights ({fmt}, seed {seed}) written by tools/make_synthetic_checkpoint.py "
                     f"from {src}" + (f", cut to {num_layers} layers" if num_layers != m.L else ""))
    c.setdefault("dtype", "bfloat16")
    if quant_cfg is not None:
        c["quantization_config"] = quant_cfg
    return c


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


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    args = ap.parse_args()

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
    cfg_path = resolve_config(cfg_arg)
    with open(cfg_path) as f:
        cfg = json.load(f)
    m = Model(cfg, cfg_path)

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

    rng = np.random.default_rng(args.seed)
    pool_sizes = {"pool_bf16": POOL_BF16_BYTES, "pool_u8": POOL_U8_BYTES, "pool_e4m3": POOL_E4M3_BYTES}
    if fmt in MODELOPT_MIXED + ("fp8-block",):
        pool_sizes["pool_fp8w"] = POOL_FP8W_BYTES
    if fmt == "fp8-block":
        pool_sizes["pool_f32s"] = POOL_F32S_BYTES
    planner = Planner(m, fmt, rng, pool_sizes, experts_layout, mtp_experts_layout, shared_nvfp4, "mtp")
    tensors = planner.build(num_layers, mtp_layers)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate tensor names in the plan")
    index_of = {t.name: i for i, t in enumerate(tensors)}
    shards = pack_shards(tensors, int(args.shard_size_gb * 1e9), args.separate_mtp_file)
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
          f"{args.shard_size_gb:g} GB; by dtype: " + ", ".join(f"{k} {gb(v)}" for k, v in sorted(by_dtype.items()))
          + f"; MTP {gb(mtp_bytes)}", file=sys.stderr)

    if args.dry_run:
        if args.list_tensors:
            for f_name, ts in shards:
                for t in ts:
                    print(f"{f_name}\t{t.name}\t{t.dtype}\t{list(t.shape)}")
        print(f"dry run: {m.arch} {fmt} layers={num_layers} mtp={mtp_layers} tensors={len(tensors)} "
              f"shards={len(shards)} total_bytes={total} ({gb(total)})")
        return

    # Output folder and disk space.
    existing = []
    if os.path.isdir(out_dir):
        existing = os.listdir(out_dir)
        if existing and not args.force:
            die(f"{out_dir} is not empty; use --force to replace the files this tool writes there")
    elif os.path.exists(out_dir):
        die(f"{out_dir} exists and is not a folder")
    reclaim = 0
    if args.force:
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
    if args.force:
        for fn in existing:
            if ours(fn):
                os.remove(os.path.join(out_dir, fn))

    tok_dir = find_tokenizer_dir()
    if tok_dir is None:
        print("warning: no Qwen3 tokenizer found (tests/fixtures/tokenizers/qwen3 or "
              "/work/shared/fixtures/tokenizers/qwen3); writing none", file=sys.stderr)

    t_pool = time.time()
    pools = make_pools(np.random.default_rng([args.seed, 2]), pool_sizes)
    t_pool = time.time() - t_pool

    t0 = time.time()
    header_bytes = 0
    with Progress(total, args.quiet) as prog:
        with ThreadPoolExecutor(max_workers=args.jobs) as ex:
            futs = [ex.submit(write_shard, os.path.join(out_dir, fn), ts, pools, args.seed, index_of, prog, args.fsync)
                    for fn, ts in shards]
            for fu in futs:
                header_bytes += fu.result()
    t_write = time.time() - t0

    weight_map = {t.name: fn for fn, ts in shards for t in ts}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    quant_cfg, hf = None, None
    if fmt == "nvfp4":
        hf, quant_cfg = quant_files(m, mtp_layers, shared_nvfp4)
    elif fmt in MODELOPT_MIXED:
        hf, quant_cfg = mixed_quant_files(m, mtp_layers, fmt, planner.quantized_layers)
    elif fmt == "fp8-block":
        quant_cfg = fp8_block_quant_config(planner.bf16_modules)
    if hf is not None:
        with open(os.path.join(out_dir, "hf_quant_config.json"), "w") as f:
            json.dump(hf, f, indent=2)
            f.write("\n")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        src = os.path.abspath(cfg_path)
        src = os.path.relpath(src, REPO) if src.startswith(REPO + os.sep) else src
        json.dump(out_config(cfg, m, num_layers, args.mtp_layers, fmt, quant_cfg, src, args.seed), f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation_config(m), f, indent=2)
        f.write("\n")
    if tok_dir:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(tok_dir, fn)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(out_dir, fn))
    elapsed = time.time() - t0
    on_disk = total + header_bytes
    print(f"wrote {out_dir}: {m.arch} {fmt} layers={num_layers} mtp={mtp_layers} tensors={len(tensors)} "
          f"shards={len(shards)} {gb(on_disk)} in {t_write:.1f} s ({on_disk / max(t_write, 1e-9) / 1e9:.2f} GB/s"
          f"{', fsync' if args.fsync else ''}; pools {t_pool:.1f} s, total {elapsed + t_pool:.1f} s)")


if __name__ == "__main__":
    main()
