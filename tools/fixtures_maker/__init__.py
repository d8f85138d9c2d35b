"""Tiny random Hugging Face checkpoints + golden outputs for Fathom's tests; tools/make_fixtures.py
is the command line, and its docstring describes the fixtures and the goldens.

One concept per module:
  common          seeds, prompt lengths, vocabulary size, eos id, shard size
  randomize       random parameter values by name, bf16 rounding, eos damping
  st_io           reading a checkpoint folder, writing shards + index, editing config json
  nvfp4           ModelOpt NVFP4 quantize / dequantize (E2M1 codes, e4m3 block scales)
  fp8             per-tensor and 128x128 block FP8 quantize / dequantize
  goldens         prompts, greedy decoding, the MTP reference, the goldens of one model
  bookkeeping     tensor counts, fathom_fixture.json, loading / checking the reference model
  qwen35          the bf16 qwen35_moe fixture (vision tower, MTP layer)
  qwen35_nvfp4    qwen35_moe_nvfp4
  qwen35_derived  helpers of the fixtures derived from the saved qwen35_moe folder
  qwen35_fp8_mixed  qwen35_moe_fp8_mixed (+ _w4a16_head)
  qwen35_fp8_block  qwen35_moe_fp8_block
  qwen3           qwen3_next and qwen3_dense
  cli             the command line: arguments, the run, re-verification, the summary
"""
