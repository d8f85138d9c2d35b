"""Writes a Hugging Face checkpoint folder with random weights in the tensor layout of a real release;
tools/make_synthetic_checkpoint.py is the command line, and its docstring describes the layouts.

One concept per module:
  common        the formats, safetensors dtype sizes, the repository root, die() / gb()
  model         a config.json's architecture and dimensions (Model)
  plan          every tensor of the checkpoint, in order, with how to fill it (T, Planner)
  values        the random values: pools sliced by the plan, E4M3 / BF16 encodings, small tensors
  shards        packing the plan into shards and streaming each to disk (pack_shards, write_shard)
  config_files  config.json, generation_config.json and the quantization configs
  cli           the command line: arguments, disk and memory checks, the run
"""
