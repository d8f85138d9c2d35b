#!/usr/bin/env python3
"""Generate tiny random Hugging Face checkpoints + golden outputs for Fathom's tests.

Usage:
    python tools/make_fixtures.py --out tests/fixtures [--device cuda|cpu]
    python tools/make_fixtures.py --out tests/fixtures --device cpu \
        --only qwen35_moe_fp8_mixed,qwen35_moe_fp8_mixed_w4a16_head,qwen35_moe_fp8_block
        (only the FP8 fixtures, derived from the already written OUT/qwen35_moe folder, or --base DIR;
         no other folder is touched)

Requires (pinned, no network needed): torch 2.11, transformers 5.17.0, safetensors 0.8, numpy.

Fixtures written (one folder each under --out):
  qwen35_moe/        Qwen3_5MoeForConditionalGeneration, bf16, sharded, FUSED experts
                     (save_pretrained(save_original_format=False)), tiny vision tower, untied
                     lm_head, plus one MTP layer in its own shard `mtp.safetensors`.
  qwen35_moe_nvfp4/  the same weights, routed + shared experts quantized to NVFP4 (ModelOpt
                     per-expert layout); everything else (incl. the whole mtp block, whose
                     experts are written per-expert BF16) stays BF16.
  qwen3_next/        Qwen3NextForCausalLM, bf16, sharded, per-expert tensors (what
                     save_pretrained writes), config.json without layer_types
                     (full_attention_interval: 4 instead).
  qwen3_dense/       Qwen3ForCausalLM, bf16, tied embeddings, single model.safetensors.
  qwen35_moe_fp8_mixed/  qwen35_moe's weights (read back from its folder) as ModelOpt MIXED_PRECISION
                     (nvidia/Qwen3.5-397B-A17B-NVFP4-V2 recipe): routed experts NVFP4 per expert, attention
                     q/k/v/o, GDN in_proj_qkv/in_proj_z/out_proj and the shared expert FP8 per tensor (W8A8,
                     static input_scale), k_scale/v_scale on the full-attention layer; MTP etc. BF16.
  qwen35_moe_fp8_mixed_w4a16_head/  the same plus a W4A16_NVFP4 lm_head (Qwen3.6-35B-A3B-NVFP4 variant).
  qwen35_moe_fp8_block/  qwen35_moe's weights as Qwen's block FP8 release (quant_method fp8, 128x128 blocks,
                     weight_scale_inv), routed experts and the MTP layer's linears per expert FP8 too.

Each folder has goldens.safetensors (F32/I32 only) and fathom_fixture.json.  All weights are
drawn on the CPU from fixed seeds, rounded to bf16, saved, and the reference model is re-loaded
from the SAVED files in float32 (eager attention, eager experts), so goldens see exactly the
on-disk bf16 values.  Goldens:
  prompt_{i}        I32 [T]        random ids in [2, vocab) (ids 0/1 are never used; 1 = eos);
                                   the prompt seed is picked among PROMPT_CANDIDATES seeds to
                                   maximise the minimum greedy margin (recorded as prompt_seed)
  logits_{i}        F32 [T, V]     teacher-forced logits (row t predicts token t+1)
  greedy_{i}        I32 [16]       greedy continuation, step by step with the KV/state cache
  greedy_margin_{i} F32 [16]       top1 - top2 logit at each greedy step
  greedy_logits_{i} F32 [16, V]    logits of each cached decode step (row s = logits after feeding
                                   prompt + greedy[:s]; row 0 = last prompt position), so a test can
                                   force the golden tokens and compare logits instead of argmaxes
  mtp_logits_{i}    F32 [T-1, V]   (Qwen3.5 fixtures) MTP logits, row t uses the main model's
                                   post-norm hidden state at position t and token prompt[t+1],
                                   all rows one causal sequence at positions 0..T-2.
  w8a8_logits_{i}   F32 [T, V]     (qwen35_moe_fp8_mixed*) teacher-forced logits with the FP8 linears'
                                   inputs quantized by their static input_scale (W8A8); see the fixture's
                                   fathom_fixture.json (goldens_semantics)
The quantized fixtures' goldens use the dequantized weights (weight-only semantics) unless said otherwise.
The eos row of lm_head (embedding row for the tied model) is scaled down so eos never wins a
greedy step: engines that stop on eos produce the same 16 tokens.
"""

import os
import sys

# the package beside this file; sys.path[0] is this folder when run as a script, not under runpy / import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fixtures_maker.cli import main  # noqa: E402
# helpers tools/make_default_goldens.py uses as make_fixtures.*
from fixtures_maker.bookkeeping import load_ref  # noqa: E402,F401
from fixtures_maker.goldens import mtp_reference, top2_margin  # noqa: E402,F401

if __name__ == "__main__":
    main(__doc__)
