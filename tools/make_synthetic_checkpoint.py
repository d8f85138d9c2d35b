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

import os
import sys

# The implementation is the synthetic_checkpoint package beside this file. Other scripts run this file by
# path from any cwd; sys.path[0] is this folder then, but not when the file is loaded by runpy or import.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synthetic_checkpoint.cli import main  # noqa: E402

if __name__ == "__main__":
    main(__doc__)
