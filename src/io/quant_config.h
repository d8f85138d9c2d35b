// Quantization settings of a checkpoint, from config.json's quantization_config or
// hf_quant_config.json (ModelOpt). Only NVFP4 (weight E2M1 + FP8 E4M3 scale per 16 + FP32
// per-tensor scale) is supported; other algorithms are rejected with a clear error.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fathom {

enum class QuantAlgo { None, NVFP4 };

struct QuantConfig {
  QuantAlgo algo = QuantAlgo::None;
  int group_size = 16;
  std::vector<std::string> exclude_modules;  // exact names or patterns with '*' wildcards
  std::string kv_cache_quant_algo;           // e.g. "FP8"; empty when none
  std::string source;                        // file it came from

  // `config_json` is config.json's text; hf_quant_config.json in `dir` is read when present.
  static QuantConfig load(const std::filesystem::path& dir, const std::string& config_json);
  static QuantConfig parse(const std::string& config_json, const std::string& hf_quant_config_json,
                           const std::string& label);

  bool is_excluded(std::string_view module) const;
  // Whether a Linear module (name without ".weight") is expected to be stored quantized.
  // Routers (`*.mlp.gate`, `*.shared_expert_gate`) and `mtp.fc` stay unquantized even when
  // the exclude list forgets them.
  bool expects_quantized(std::string_view module) const;
};

// fnmatch-style match where '*' matches any run of characters (including '.').
bool wildcard_match(std::string_view pattern, std::string_view text);

const char* quant_algo_name(QuantAlgo a);

}  // namespace fathom
