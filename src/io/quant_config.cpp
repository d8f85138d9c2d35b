#include "io/quant_config.h"
#include "io/text_file.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace fathom {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Label prefix for messages: "LABEL: " or "".
std::string pre(const std::string& label) { return label.empty() ? std::string() : label + ": "; }

json parse_object(const std::string& text, const std::string& label, const char* file) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(pre(label), file, " is not valid JSON");
  if (!j.is_object()) fail(pre(label), file, " is a JSON ", j.type_name(), ", expected an object");
  return j;
}

const json* find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string get_string(const json& obj, const char* key, const std::string& label, const char* file,
                       const char* where) {
  const json* v = find(obj, key);
  if (!v) return {};
  if (!v->is_string())
    fail(pre(label), "field '", where, key, "' in ", file, " is a JSON ", v->type_name(), ", expected a string");
  return v->get<std::string>();
}

std::vector<std::string> get_string_list(const json& obj, const char* key, const std::string& label,
                                         const char* file, const char* where) {
  std::vector<std::string> out;
  const json* v = find(obj, key);
  if (!v) return out;
  if (!v->is_array())
    fail(pre(label), "field '", where, key, "' in ", file, " is a JSON ", v->type_name(),
         ", expected a list of strings");
  for (const auto& e : *v) {
    if (!e.is_string())
      fail(pre(label), "field '", where, key, "' in ", file, " holds a JSON ", e.type_name(),
           ", expected strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::optional<int> get_int(const json& obj, const char* key, const std::string& label, const char* file,
                           const char* where) {
  const json* v = find(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    fail(pre(label), "field '", where, key, "' in ", file, " is a JSON ", v->type_name(), ", expected an integer");
  int64_t i = v->is_number_unsigned() ? int64_t(std::min<uint64_t>(v->get<uint64_t>(), uint64_t(INT32_MAX) + 1))
                                      : v->get<int64_t>();
  if (i < INT32_MIN || i > INT32_MAX) fail(pre(label), "field '", where, key, "' in ", file, " is out of range");
  return int(i);
}

[[noreturn]] void unsupported(const std::string& algo, const std::string& label, const char* file) {
  fail(pre(label), "unsupported quantization algorithm '", algo, "' in ", file,
       " (supported: NVFP4, FP8, MIXED_PRECISION; quant_method fp8)");
}

void check_group_size(int g, const std::string& label, const char* file) {
  if (g != 16) fail(pre(label), "NVFP4 group_size ", g, " in ", file, " is not supported (expected 16)");
}

std::string upper(std::string s) {
  for (auto& ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// A checkpoint-wide ModelOpt algorithm name.
QuantAlgo modelopt_algo(const std::string& name, const std::string& label, const char* file) {
  const std::string u = upper(name);
  if (u == "NVFP4") return QuantAlgo::NVFP4;
  if (u == "FP8") return QuantAlgo::FP8;
  if (u == "MIXED_PRECISION") return QuantAlgo::MixedPrecision;
  unsupported(name, label, file);
}

// MIXED_PRECISION's `quantized_layers`: {module: {"quant_algo": ..., "group_size": ...}}.
void parse_quantized_layers(const json& obj, QuantConfig& c, const std::string& label, const char* file,
                            const char* where) {
  const json* layers = find(obj, "quantized_layers");
  if (!layers) return;
  if (!layers->is_object())
    fail(pre(label), "field '", where, "quantized_layers' in ", file, " is a JSON ", layers->type_name(),
         ", expected an object");
  for (const auto& [module, entry] : layers->items()) {
    if (!entry.is_object())
      fail(pre(label), "quantized_layers entry '", module, "' in ", file, " is a JSON ", entry.type_name(),
           ", expected an object");
    std::string algo = upper(get_string(entry, "quant_algo", label, file, "quantized_layers.*."));
    if (algo != "NVFP4" && algo != "W4A16_NVFP4" && algo != "FP8")
      fail(pre(label), "unsupported quantization algorithm '", get_string(entry, "quant_algo", label, file, ""),
           "' for module '", module, "' in ", file, " (supported per module: NVFP4, W4A16_NVFP4, FP8)");
    if (algo != "FP8") check_group_size(get_int(entry, "group_size", label, file, "quantized_layers.*.").value_or(16), label, file);
    c.quantized_layers[module] = algo;
  }
}

void finish_modelopt(QuantConfig& c, const std::string& label, const char* file) {
  if (c.algo == QuantAlgo::NVFP4) check_group_size(c.group_size, label, file);
  if (c.algo == QuantAlgo::MixedPrecision && c.quantized_layers.empty())
    fail(pre(label), "quant_algo MIXED_PRECISION in ", file, " lists no quantized_layers");
}

// hf_quant_config.json: {"quantization": {"quant_algo", "group_size", "exclude_modules",
// "kv_cache_quant_algo", "quantized_layers"}}
QuantConfig parse_hf(const std::string& text, const std::string& label) {
  const char* file = "hf_quant_config.json";
  json j = parse_object(text, label, file);
  const json* q = find(j, "quantization");
  if (!q) fail(pre(label), "missing field 'quantization' in ", file);
  if (!q->is_object())
    fail(pre(label), "field 'quantization' in ", file, " is a JSON ", q->type_name(), ", expected an object");
  QuantConfig c;
  c.source = file;
  std::string algo = get_string(*q, "quant_algo", label, file, "quantization.");
  if (algo.empty()) fail(pre(label), "missing field 'quantization.quant_algo' in ", file);
  c.algo = modelopt_algo(algo, label, file);
  c.group_size = get_int(*q, "group_size", label, file, "quantization.").value_or(16);
  c.exclude_modules = get_string_list(*q, "exclude_modules", label, file, "quantization.");
  c.kv_cache_quant_algo = get_string(*q, "kv_cache_quant_algo", label, file, "quantization.");
  parse_quantized_layers(*q, c, label, file, "quantization.");
  finish_modelopt(c, label, file);
  return c;
}

// quant_method "fp8" (Qwen's FP8 releases, transformers' FineGrainedFP8).
QuantConfig parse_fp8_method(const json& qc, const std::string& label) {
  const char* file = "config.json";
  const char* where = "quantization_config.";
  QuantConfig c;
  c.source = file;
  const std::string fmt = get_string(qc, "fmt", label, file, where);
  if (!fmt.empty() && fmt != "e4m3") unsupported("fp8 (fmt " + fmt + ")", label, file);
  const std::string scheme = get_string(qc, "activation_scheme", label, file, where);
  if (!scheme.empty() && scheme != "dynamic" && scheme != "static")
    fail(pre(label), "field 'quantization_config.activation_scheme' in ", file, " is '", scheme,
         "', expected 'dynamic' or 'static'");
  c.dynamic_activations = scheme != "static";
  c.algo = QuantAlgo::FP8;
  if (const json* b = find(qc, "weight_block_size")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
        (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0 || (*b)[0].get<int64_t>() > 65536 ||
        (*b)[1].get<int64_t>() > 65536)
      fail(pre(label), "field 'quantization_config.weight_block_size' in ", file,
           " must be two positive integers, e.g. [128, 128]");
    c.weight_block_size = {int((*b)[0].get<int64_t>()), int((*b)[1].get<int64_t>())};
    c.algo = QuantAlgo::BlockFP8;
  }
  c.not_converted = get_string_list(qc, "modules_to_not_convert", label, file, where);
  for (auto& m : get_string_list(qc, "ignored_layers", label, file, where)) c.not_converted.push_back(m);
  return c;
}

// The checkpoint-wide algorithm from compressed-tensors-like `config_groups`: 4-bit float
// weights in groups of 16 are NVFP4, 8-bit float weights FP8, both MIXED_PRECISION.
std::string algo_from_groups(const json& groups, const std::string& method, std::optional<int>& group,
                             const std::string& label, const char* file) {
  if (!groups.is_object())
    fail(pre(label), "field 'quantization_config.config_groups' in ", file, " is a JSON ", groups.type_name(),
         ", expected an object");
  bool fp4 = false, fp8 = false;
  const char* where = "quantization_config.config_groups.*.weights.";
  for (const auto& [gname, g] : groups.items()) {
    if (!g.is_object()) continue;
    const json* w = find(g, "weights");
    if (!w || !w->is_object()) continue;
    auto bits = get_int(*w, "num_bits", label, file, where);
    std::string type = get_string(*w, "type", label, file, where);
    auto gs = get_int(*w, "group_size", label, file, where);
    std::string desc = std::string(type.empty() ? "?" : type) + std::to_string(bits.value_or(0));
    if (bits == 4 && type == "float") {
      fp4 = true;
      if (gs) group = gs;
    } else if (bits == 8 && type == "float") {
      fp8 = true;
    } else {
      unsupported(desc + " weights (" + (method.empty() ? "?" : method) + ")", label, file);
    }
  }
  return fp4 && fp8 ? "MIXED_PRECISION" : fp4 ? "NVFP4" : fp8 ? "FP8" : "";
}

// config.json's quantization_config (ModelOpt or its compressed-tensors-like rewrite, or fp8).
QuantConfig parse_config_json(const json& qc, const std::string& label) {
  const char* file = "config.json";
  if (!qc.is_object())
    fail(pre(label), "field 'quantization_config' in ", file, " is a JSON ", qc.type_name(), ", expected an object");
  const char* where = "quantization_config.";
  std::string method = get_string(qc, "quant_method", label, file, where);
  if (method == "fp8") return parse_fp8_method(qc, label);
  QuantConfig c;
  c.source = file;
  std::string algo = get_string(qc, "quant_algo", label, file, where);
  std::optional<int> group = get_int(qc, "group_size", label, file, where);
  if (algo.empty())
    if (const json* groups = find(qc, "config_groups")) algo = algo_from_groups(*groups, method, group, label, file);
  if (algo.empty()) {
    if (method.empty()) fail(pre(label), "field 'quantization_config' in ", file, " names no quant_method or quant_algo");
    unsupported(method, label, file);
  }
  c.algo = modelopt_algo(algo, label, file);
  if (!method.empty() && method != "modelopt" && method != "modelopt_fp4" && method != "compressed-tensors")
    unsupported(method, label, file);
  c.group_size = group.value_or(16);
  c.exclude_modules = get_string_list(qc, "ignore", label, file, where);
  for (auto& m : get_string_list(qc, "exclude_modules", label, file, where)) c.exclude_modules.push_back(m);
  c.kv_cache_quant_algo = get_string(qc, "kv_cache_quant_algo", label, file, where);
  if (c.kv_cache_quant_algo.empty()) {
    if (const json* kv = find(qc, "kv_cache_scheme"); kv && kv->is_object()) {
      auto bits = get_int(*kv, "num_bits", label, file, "quantization_config.kv_cache_scheme.");
      std::string type = get_string(*kv, "type", label, file, "quantization_config.kv_cache_scheme.");
      if (bits == 8 && type == "float") c.kv_cache_quant_algo = "FP8";
      else if (bits) c.kv_cache_quant_algo = type + std::to_string(*bits);
    }
  }
  parse_quantized_layers(qc, c, label, file, where);
  finish_modelopt(c, label, file);
  return c;
}

}  // namespace

QuantConfig QuantConfig::load(const fs::path& dir, const std::string& config_json) {
  std::string hf;
  std::error_code ec;
  const fs::path p = dir / "hf_quant_config.json";
  if (fs::exists(p, ec)) hf = read_text_file(p);
  return parse(config_json, hf, dir.string());
}

QuantConfig QuantConfig::parse(const std::string& config_json, const std::string& hf_quant_config_json,
                               const std::string& label) {
  std::optional<QuantConfig> from_cfg, from_hf;
  if (!config_json.empty()) {
    json cfg = parse_object(config_json, label, "config.json");
    if (const json* qc = find(cfg, "quantization_config")) from_cfg = parse_config_json(*qc, label);
  }
  if (!hf_quant_config_json.empty()) from_hf = parse_hf(hf_quant_config_json, label);
  if (from_hf && from_cfg) {
    // Both describe the same export; merge the exclude lists (either may miss entries).
    QuantConfig c = *from_hf;
    for (auto& m : from_cfg->exclude_modules)
      if (std::find(c.exclude_modules.begin(), c.exclude_modules.end(), m) == c.exclude_modules.end())
        c.exclude_modules.push_back(m);
    if (c.kv_cache_quant_algo.empty()) c.kv_cache_quant_algo = from_cfg->kv_cache_quant_algo;
    for (auto& [module, algo] : from_cfg->quantized_layers) c.quantized_layers.emplace(module, algo);
    c.source = "hf_quant_config.json+config.json";
    return c;
  }
  if (from_hf) return *from_hf;
  if (from_cfg) return *from_cfg;
  return QuantConfig{};
}

bool wildcard_match(std::string_view p, std::string_view t) {
  // Iterative glob with single-star backtracking: O(|p|*|t|) worst case.
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (pi < p.size() && p[pi] == t[ti]) {
      ++pi;
      ++ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool QuantConfig::is_excluded(std::string_view module) const {
  for (const auto& pat : exclude_modules)
    if (wildcard_match(pat, module)) return true;
  for (const auto& part : not_converted)
    if (!part.empty() && module.find(part) != std::string_view::npos) return true;
  return false;
}

namespace {
// A MIXED_PRECISION entry for the module, or for the routed experts it belongs to.
const std::string* listed_algo(const QuantConfig& q, std::string_view module) {
  if (auto it = q.quantized_layers.find(module); it != q.quantized_layers.end()) return &it->second;
  const size_t at = module.rfind(".experts.");
  if (at == std::string_view::npos) return nullptr;
  auto it = q.quantized_layers.find(module.substr(0, at + 8));
  return it == q.quantized_layers.end() ? nullptr : &it->second;
}
}  // namespace

bool QuantConfig::lists_module(std::string_view module) const {
  return algo == QuantAlgo::MixedPrecision && listed_algo(*this, module) != nullptr;
}

std::string QuantConfig::module_algo(std::string_view module) const {
  if (algo == QuantAlgo::None || is_excluded(module)) return {};
  if (module.ends_with(".mlp.gate") || module == "mlp.gate") return {};
  if (module.ends_with(".shared_expert_gate") || module == "shared_expert_gate") return {};
  if (module == "mtp.fc" || module.ends_with(".mtp.fc")) return {};
  switch (algo) {
    case QuantAlgo::None: return {};
    case QuantAlgo::NVFP4: return "NVFP4";
    case QuantAlgo::FP8:
    case QuantAlgo::BlockFP8: return "FP8";
    case QuantAlgo::MixedPrecision: {
      const std::string* a = listed_algo(*this, module);
      return a ? *a : std::string();
    }
  }
  return {};
}

bool QuantConfig::declares_nvfp4() const {
  if (algo == QuantAlgo::NVFP4) return true;
  for (const auto& [module, a] : quantized_layers)
    if (a != "FP8") return true;
  return false;
}

bool QuantConfig::declares_fp8() const {
  if (algo == QuantAlgo::FP8 || algo == QuantAlgo::BlockFP8) return true;
  for (const auto& [module, a] : quantized_layers)
    if (a == "FP8") return true;
  return false;
}

const char* quant_algo_name(QuantAlgo a) {
  switch (a) {
    case QuantAlgo::None: return "none";
    case QuantAlgo::NVFP4: return "NVFP4";
    case QuantAlgo::FP8: return "FP8";
    case QuantAlgo::MixedPrecision: return "MIXED_PRECISION";
    case QuantAlgo::BlockFP8: return "FP8 (block)";
  }
  return "?";
}

}  // namespace fathom
