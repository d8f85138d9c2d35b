#include "model/model_summary.h"
#include "io/text_file.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/module_format.h"
#include "io/quant_config.h"
#include "model/model_tensors.h"

namespace fathom {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

bool is_mtp(std::string_view n) { return starts_with(n, "mtp.") || starts_with(n, "model.mtp."); }
bool is_vision(std::string_view n) {
  return starts_with(n, "model.visual.") || starts_with(n, "visual.") || starts_with(n, "model.vision_tower.") ||
         starts_with(n, "vision_tower.");
}
bool is_scale(std::string_view n) {
  for (const char* s : {".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale", ".k_scale", ".v_scale"})
    if (ends_with(n, s)) return true;
  return false;
}
bool is_routed_expert(std::string_view n) { return n.find(".mlp.experts.") != std::string_view::npos; }
// Fused 3-D expert container, e.g. `...mlp.experts.gate_up_proj` [E, 2I, H].
bool is_fused_experts(std::string_view n, size_t ndim) {
  return ndim == 3 && n.find("experts.") != std::string_view::npos &&
         (ends_with(n, "_proj") || ends_with(n, "_proj.weight"));
}


std::string human_count(int64_t n) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  double v = double(n);
  if (v >= 1e9) os << v / 1e9 << "B";
  else if (v >= 1e6) os << v / 1e6 << "M";
  else if (v >= 1e3) os << v / 1e3 << "K";
  else os << n;
  return os.str();
}

std::string human_bytes(uint64_t n) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  double v = double(n);
  if (v >= double(1ull << 30)) os << v / double(1ull << 30) << " GiB";
  else if (v >= double(1ull << 20)) os << v / double(1ull << 20) << " MiB";
  else if (v >= 1024) os << v / 1024 << " KiB";
  else os << n << " B";
  return os.str();
}

// Counts one tensor into the summary: its bytes, whether it belongs to the MTP layer or the
// vision tower, whether it is stored quantized as the config expects, its parameters.
void count_tensor(ModelSummary& s, const Checkpoint& ck, const QuantConfig& qc, const std::string& name) {
  const TensorInfo& t = ck.info(name);
  s.bytes_by_dtype[std::string(dtype_name(t.dtype))] += t.nbytes;
  s.total_bytes += t.nbytes;

  const bool mtp = is_mtp(name), vision = is_vision(name);
  if (mtp) ++s.mtp_tensors;
  if (vision) ++s.vision_tensors;

  // Quantized / unquantized modules.
  const bool has_scale_tensor = ends_with(name, ".weight") && (ck.has(name + "_scale") || ck.has(name + "_scale_inv"));
  if (ends_with(name, ".weight_scale") || ends_with(name, ".weight_scale_inv")) {
    ++s.quantized_modules;
    const std::string module = name.substr(0, name.rfind(".weight_scale"));
    if (!vision && !qc.expects_quantized(module)) ++s.quantized_but_not_expected;
  } else if (ends_with(name, ".weight") && t.shape.size() == 2 && !has_scale_tensor &&
             !ends_with(name, "embed_tokens.weight") && !ends_with(name, "pos_embed.weight")) {  // embeddings
    ++s.unquantized_linear_modules;
    const std::string module = name.substr(0, name.size() - 7);
    if (!vision && qc.expects_quantized(module)) ++s.unquantized_but_expected;
  } else if (is_fused_experts(name, t.shape.size())) {
    ++s.unquantized_linear_modules;
  }

  // Parameters.
  if (is_scale(name)) return;
  int64_t p = t.numel();
  if (t.dtype == DType::U8 && has_scale_tensor) p *= 2;  // two E2M1 values per byte
  if (mtp) {
    s.params_mtp += p;
  } else if (vision) {
    s.params_vision += p;
  } else {
    s.params_total += p;
    if (is_routed_expert(name) || is_fused_experts(name, t.shape.size())) s.params_routed_experts += p;
  }
}

// Every linear module's resolved format, counted by module kind, and the bytes of each format.
void count_formats(ModelSummary& s, const Checkpoint& ck, const QuantConfig& qc) {
  check_quantized_layers(ck, qc);
  for (const LinearSpec& l : stored_linear_modules(model_tensors(s.config))) {
    if (!ck.has(l.weight())) continue;  // tied lm_head, fused experts, no MTP layer
    const std::string label = resolve_module_format(ck, qc, l.module, l.out, l.in).label(ck, l.module);
    ++s.formats_by_kind[module_kind_name(l.kind)][label];
    for (const char* part : {".weight", ".weight_scale", ".weight_scale_2", ".weight_scale_inv", ".input_scale"})
      if (ck.has(l.module + part)) s.bytes_by_format[label] += ck.info(l.module + part).nbytes;
  }
}

}  // namespace

std::string compress_layer_pattern(const std::string& t) {
  const size_t n = t.size();
  for (size_t p = 1; p < n; ++p) {
    if (n % p) continue;
    bool ok = true;
    for (size_t i = p; i < n && ok; ++i) ok = t[i] == t[i - p];
    if (ok) return t.substr(0, p) + " x" + std::to_string(n / p);
  }
  return t;
}

ModelSummary summarize_checkpoint(const std::filesystem::path& dir) {
  ModelSummary s;
  s.dir = dir.string();
  s.config = ModelConfig::load(dir);
  const ModelConfig& cfg = s.config;
  const QuantConfig qc = QuantConfig::load(dir, read_text_file(dir / "config.json"));
  const auto ck = Checkpoint::open(dir);

  for (auto lt : cfg.layer_types) s.layer_types += lt == LayerType::FullAttention ? 'F' : 'L';
  s.layer_pattern = compress_layer_pattern(s.layer_types);

  s.quant_algorithm = quant_algo_name(qc.algo);
  s.quant_group_size = qc.algo == QuantAlgo::NVFP4 || qc.algo == QuantAlgo::MixedPrecision ? qc.group_size : 0;
  s.kv_cache_quant_algo = qc.kv_cache_quant_algo;
  s.exclude_modules = int64_t(qc.exclude_modules.size());

  const auto names = ck->names();
  s.num_tensors = int64_t(names.size());
  for (const auto& name : names) count_tensor(s, *ck, qc, name);
  count_formats(s, *ck, qc);
  s.params_active = s.params_total;
  if (cfg.num_experts > 0) {
    const double unused = 1.0 - double(cfg.num_experts_per_tok) / double(cfg.num_experts);
    s.params_active -= int64_t(std::llround(double(s.params_routed_experts) * unused));
  }

  s.mtp_present = s.mtp_tensors > 0;
  s.vision_present = cfg.has_vision || s.vision_tensors > 0;

  const KvCacheDtype kv_dtype = resolve_kv_cache_dtype("auto", qc.kv_cache_quant_algo);
  s.kv_cache_dtype = kv_cache_dtype_name(kv_dtype);
  const int64_t kv_layer = cfg.kv_bytes_per_token_per_layer(kv_dtype);
  s.kv_cache_bytes_per_token = int64_t(cfg.num_full_attention_layers()) * kv_layer;
  s.mtp_kv_cache_bytes_per_token = int64_t(s.mtp_present ? cfg.mtp_num_hidden_layers : 0) * kv_layer;
  if (cfg.num_linear_attention_layers() > 0) {
    // fp32 recurrent state, bf16 convolution window
    const int64_t per_layer = cfg.linear_recurrent_state_values() * 4 + cfg.linear_conv_state_values() * 2;
    s.linear_state_bytes_per_sequence = per_layer * cfg.num_linear_attention_layers();
  }
  return s;
}

nlohmann::json ModelSummary::to_json() const {
  using nlohmann::json;
  json bytes = json::object();
  for (const auto& [k, v] : bytes_by_dtype) bytes[k] = v;
  return json{
      {"dir", dir},
      {"architecture", config.architecture},
      {"family", family_name(config.family)},
      {"model_type", config.model_type},
      {"weight_prefix", config.weight_prefix},
      {"layers",
       {{"count", config.num_hidden_layers},
        {"full_attention", config.num_full_attention_layers()},
        {"linear_attention", config.num_linear_attention_layers()},
        {"pattern", layer_pattern},
        {"types", layer_types}}},
      {"hidden_size", config.hidden_size},
      {"vocab_size", config.vocab_size},
      {"intermediate_size", config.intermediate_size},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"attention",
       {{"num_attention_heads", config.num_attention_heads},
        {"num_key_value_heads", config.num_key_value_heads},
        {"head_dim", config.head_dim},
        {"rotary_dim", config.rotary_dim()}}},
      {"linear_attention",
       {{"num_key_heads", config.linear_num_key_heads},
        {"num_value_heads", config.linear_num_value_heads},
        {"key_head_dim", config.linear_key_head_dim},
        {"value_head_dim", config.linear_value_head_dim},
        {"conv_kernel_dim", config.linear_conv_kernel_dim}}},
      {"moe",
       {{"num_experts", config.num_experts},
        {"num_experts_per_tok", config.num_experts_per_tok},
        {"moe_intermediate_size", config.moe_intermediate_size},
        {"shared_expert_intermediate_size", config.shared_expert_intermediate_size}}},
      {"parameters",
       {{"total", params_total},
        {"active", params_active},
        {"routed_experts", params_routed_experts},
        {"mtp", params_mtp},
        {"vision", params_vision}}},
      {"tensors", num_tensors},
      {"total_bytes", total_bytes},
      {"bytes_by_dtype", bytes},
      {"quantization",
       {{"algorithm", quant_algorithm},
        {"group_size", quant_group_size},
        {"kv_cache_quant_algo", kv_cache_quant_algo},
        {"quantized_modules", quantized_modules},
        {"unquantized_linear_modules", unquantized_linear_modules},
        {"exclude_modules", exclude_modules},
        {"quantized_but_not_expected", quantized_but_not_expected},
        {"unquantized_but_expected", unquantized_but_expected},
        {"formats_by_module_kind", formats_by_kind},
        {"bytes_by_format", bytes_by_format}}},
      {"mtp", {{"present", mtp_present}, {"layers", config.mtp_num_hidden_layers}, {"tensors", mtp_tensors}}},
      {"vision", {{"present", vision_present}, {"tensors", vision_tensors}, {"ignored", vision_ignored}}},
      {"memory",
       {{"kv_cache_dtype", kv_cache_dtype},
        {"kv_cache_bytes_per_token", kv_cache_bytes_per_token},
        {"mtp_kv_cache_bytes_per_token", mtp_kv_cache_bytes_per_token},
        {"linear_state_bytes_per_sequence", linear_state_bytes_per_sequence}}},
  };
}

void print_summary(std::ostream& os, const ModelSummary& s) {
  const ModelConfig& c = s.config;
  os << "model:          " << s.dir << "\n";
  os << "architecture:   " << c.architecture << " (family " << family_name(c.family);
  if (!c.model_type.empty()) os << ", model_type " << c.model_type;
  os << ")\n";
  os << "layers:         " << c.num_hidden_layers << " (" << s.layer_pattern << "; " << c.num_full_attention_layers()
     << " full attention, " << c.num_linear_attention_layers() << " linear attention)\n";
  os << "hidden size:    " << c.hidden_size << "\n";
  os << "attention:      " << c.num_attention_heads << " q heads, " << c.num_key_value_heads << " kv heads, head_dim "
     << c.head_dim << ", rotary dim " << c.rotary_dim() << "\n";
  if (c.num_linear_attention_layers() > 0)
    os << "linear attn:    " << c.linear_num_key_heads << " key heads x " << c.linear_key_head_dim << ", "
       << c.linear_num_value_heads << " value heads x " << c.linear_value_head_dim << ", conv kernel "
       << c.linear_conv_kernel_dim << "\n";
  if (c.num_experts > 0)
    os << "experts:        " << c.num_experts << " routed, top-" << c.num_experts_per_tok << ", expert width "
       << c.moe_intermediate_size << ", shared expert " << c.shared_expert_intermediate_size << "\n";
  else
    os << "mlp:            dense, intermediate " << c.intermediate_size << "\n";
  os << "vocab:          " << c.vocab_size << (c.tie_word_embeddings ? " (tied embeddings)" : "") << "\n";
  os << "parameters:     " << human_count(s.params_total) << " total, " << human_count(s.params_active)
     << " active per token (text model; " << s.params_total << " / " << s.params_active << ")\n";
  os << "                MTP " << human_count(s.params_mtp) << ", vision " << human_count(s.params_vision) << "\n";
  os << "tensors:        " << s.num_tensors << ", " << human_bytes(s.total_bytes) << " (";
  bool first = true;
  for (const auto& [k, v] : s.bytes_by_dtype) {
    os << (first ? "" : ", ") << k << " " << human_bytes(v);
    first = false;
  }
  os << ")\n";
  os << "quantization:   " << s.quant_algorithm;
  if (s.quant_group_size > 0) os << ", NVFP4 group size " << s.quant_group_size;
  if (!s.kv_cache_quant_algo.empty()) os << ", kv cache " << s.kv_cache_quant_algo;
  os << "; " << s.quantized_modules << " modules quantized, " << s.unquantized_linear_modules
     << " linear modules unquantized, " << s.exclude_modules << " exclude entries\n";
  if (s.quantized_but_not_expected || s.unquantized_but_expected)
    os << "                note: " << s.quantized_but_not_expected << " quantized modules the config excludes, "
       << s.unquantized_but_expected << " unquantized modules the config expects quantized\n";
  for (const auto& [kind, formats] : s.formats_by_kind) {
    os << "  " << std::left << std::setw(20) << kind + ":" << std::right;
    bool first_format = true;
    for (const auto& [label, n] : formats) {
      os << (first_format ? "" : ", ") << n << " " << label;
      first_format = false;
    }
    os << "\n";
  }
  if (!s.bytes_by_format.empty()) {
    os << "  bytes by format:   ";
    bool first_format = true;
    for (const auto& [label, b] : s.bytes_by_format) {
      os << (first_format ? "" : ", ") << label << " " << human_bytes(b);
      first_format = false;
    }
    os << "\n";
  }
  os << "mtp:            " << (s.mtp_present ? "present" : "absent") << ", " << c.mtp_num_hidden_layers << " layer(s), "
     << s.mtp_tensors << " tensors\n";
  os << "vision tower:   " << (s.vision_present ? "present" : "absent") << ", " << s.vision_tensors
     << " tensors" << (s.vision_present ? " (ignored)" : "") << "\n";
  os << "kv cache:       " << s.kv_cache_bytes_per_token << " bytes/token (" << s.kv_cache_dtype << ")";
  if (s.mtp_kv_cache_bytes_per_token) os << " + MTP " << s.mtp_kv_cache_bytes_per_token << " bytes/token";
  os << "\n";
  if (c.num_linear_attention_layers() > 0)
    os << "linear state:   " << human_bytes(uint64_t(s.linear_state_bytes_per_sequence)) << " per sequence ("
       << s.linear_state_bytes_per_sequence << " bytes)\n";
}

}  // namespace fathom
