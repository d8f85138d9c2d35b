// `fathom inspect`: a summary of a checkpoint folder (config + tensors), without loading weights.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace fathom {

struct ModelSummary {
  std::string dir;
  ModelConfig config;  // the text model's hyper-parameters, as parsed

  // Derived from the config for display: 'L' = linear attention (Gated DeltaNet), 'F' = full
  // attention, one letter per layer ("LLLFLLLF"), and that compressed when periodic ("LLLF x2").
  std::string layer_types;
  std::string layer_pattern;

  // Parameters (an NVFP4 byte counts as two; scale tensors are not counted).
  int64_t params_total = 0;           // text model only
  int64_t params_active = 0;          // per token: total minus the routed experts not selected
  int64_t params_routed_experts = 0;  // all routed experts of the text model
  int64_t params_mtp = 0;
  int64_t params_vision = 0;

  int64_t num_tensors = 0;
  uint64_t total_bytes = 0;
  std::map<std::string, uint64_t> bytes_by_dtype;

  // Quantization
  std::string quant_algorithm = "none";
  int quant_group_size = 0;
  std::string kv_cache_quant_algo;
  int64_t quantized_modules = 0;           // modules with a `.weight_scale` tensor
  int64_t unquantized_linear_modules = 0;  // 2-D `.weight` (not embeddings) + fused 3-D expert tensors
  int64_t exclude_modules = 0;             // length of the exclude list
  int64_t quantized_but_not_expected = 0;  // stored quantized although the config says otherwise
  int64_t unquantized_but_expected = 0;    // stored unquantized although the config expects NVFP4
  // Resolved per linear module (io/module_format.h): module kind -> format label -> modules, and
  // format label -> bytes (weights and their scales).
  std::map<std::string, std::map<std::string, int64_t>> formats_by_kind;
  std::map<std::string, uint64_t> bytes_by_format;

  // MTP (the layer count is the config's mtp_num_hidden_layers)
  bool mtp_present = false;
  int64_t mtp_tensors = 0;

  // Vision tower (never loaded)
  bool vision_present = false;
  int64_t vision_tensors = 0;
  bool vision_ignored = true;

  // Memory
  // The KV cache's element type with --kv-cache-dtype auto ("bf16", or "fp8_e4m3" when the
  // quantization config says kv_cache_quant_algo FP8), and K+V bytes per token in it.
  std::string kv_cache_dtype = "bf16";
  int64_t kv_cache_bytes_per_token = 0;      // K+V of the full-attention layers
  int64_t mtp_kv_cache_bytes_per_token = 0;  // K+V of the MTP layers
  int64_t linear_state_bytes_per_sequence = 0;  // fp32 recurrent state + bf16 conv state

  nlohmann::json to_json() const;
};

// Reads config.json (+ generation_config.json, hf_quant_config.json) and the safetensors headers.
ModelSummary summarize_checkpoint(const std::filesystem::path& dir);

// "LLLF x15" when the sequence repeats a shorter block, else the sequence itself.
std::string compress_layer_pattern(const std::string& types);

void print_summary(std::ostream& os, const ModelSummary& s);

}  // namespace fathom
