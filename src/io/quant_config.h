// Quantization settings of a checkpoint, from config.json's quantization_config or
// hf_quant_config.json (ModelOpt). Supported:
//  - ModelOpt NVFP4 (weight E2M1 + FP8 E4M3 scale per 16 + FP32 per-tensor scale);
//  - ModelOpt FP8 (E4M3 weights, FP32 per-tensor scale, static FP32 input scale: W8A8);
//  - ModelOpt MIXED_PRECISION: one algorithm per module under `quantized_layers` (NVFP4,
//    W4A16_NVFP4, FP8), e.g. NVFP4 routed experts with FP8 attention (Qwen3.5-...-NVFP4-V2);
//  - `quant_method: fp8` (Qwen's own FP8 releases): E4M3 weights with an FP32 `weight_scale_inv`
//    per `weight_block_size` block (or per tensor / channel without one), dynamic activations.
// Other algorithms are load errors naming the algorithm (and the module, for per-module ones).
// What a module is actually stored as is decided from its tensors (model/module_formats.h); this
// is what the config declares.
#pragma once
#include <array>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fathom {

enum class QuantAlgo { None, NVFP4, FP8, MixedPrecision, BlockFP8 };

struct QuantConfig {
  QuantAlgo algo = QuantAlgo::None;
  int group_size = 16;
  std::vector<std::string> exclude_modules;  // exact names or patterns with '*' wildcards
  std::vector<std::string> not_converted;    // quant_method fp8's modules_to_not_convert: name substrings
  std::string kv_cache_quant_algo;           // e.g. "FP8"; empty when none
  // MIXED_PRECISION: module (as the checkpoint names it, routed experts as one `...mlp.experts`
  // entry) -> "NVFP4", "W4A16_NVFP4" or "FP8".
  std::map<std::string, std::string, std::less<>> quantized_layers;
  std::array<int, 2> weight_block_size{0, 0};  // BlockFP8: rows x columns a scale covers
  bool dynamic_activations = false;            // quant_method fp8's activation_scheme "dynamic"
  std::string source;                          // file it came from

  // `config_json` is config.json's text; hf_quant_config.json in `dir` is read when present.
  static QuantConfig load(const std::filesystem::path& dir, const std::string& config_json);
  static QuantConfig parse(const std::string& config_json, const std::string& hf_quant_config_json,
                           const std::string& label);

  bool is_excluded(std::string_view module) const;
  // The algorithm the config declares for a Linear module (name without ".weight"): "NVFP4",
  // "W4A16_NVFP4", "FP8" or "" (unquantized). Routers (`*.mlp.gate`, `*.shared_expert_gate`)
  // and `mtp.fc` stay unquantized even when the exclude list forgets them.
  std::string module_algo(std::string_view module) const;
  bool expects_quantized(std::string_view module) const { return !module_algo(module).empty(); }
  // Whether the config names this module explicitly (a MIXED_PRECISION entry): then its stored
  // format must match.
  bool lists_module(std::string_view module) const;
  // Whether any module is declared NVFP4 (W4A16_NVFP4 included) / FP8: which kernel families a
  // model loaded from this checkpoint runs (the backend checks).
  bool declares_nvfp4() const;
  bool declares_fp8() const;
};

// fnmatch-style match where '*' matches any run of characters (including '.').
bool wildcard_match(std::string_view pattern, std::string_view text);

const char* quant_algo_name(QuantAlgo a);

}  // namespace fathom
