// Seeded random checkpoints for the shape sweep (the CUDA engine against the fp32 CPU engine over
// configs from a space wider than the fixtures): Qwen3.5-MoE, Qwen3-Next and dense Qwen3, in BF16
// or ModelOpt NVFP4, written as Hugging Face folders in the layout of the real releases.
//
// The configs are sweep_config.h's; the weights are a function of the config's seed
// (seeded_random.h), the same on every machine.
#pragma once
#include <filesystem>

#include "model/sweep_config.h"

namespace fathom::testutil {

// Writes config.json, generation_config.json, (NVFP4) hf_quant_config.json and the safetensors
// shards with their index into `dir` (created when missing). Weights are seeded from cfg.seed.
void write_random_checkpoint(const SweepConfig& cfg, const std::filesystem::path& dir);

}  // namespace fathom::testutil
