#include "io/model_config.h"
#include "io/text_file.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace fathom {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kMaxLayers = 1 << 16;  // sanity bound (also keeps fuzzed configs from allocating GBs)

struct ArchInfo {
  const char* name;
  ModelFamily family;
  bool multimodal;
};
constexpr ArchInfo kArchs[] = {
    {"Qwen3ForCausalLM", ModelFamily::Qwen3, false},
    {"Qwen3NextForCausalLM", ModelFamily::Qwen3Next, false},
    {"Qwen3_5MoeForConditionalGeneration", ModelFamily::Qwen3_5Moe, true},
    {"Qwen3_5MoeForCausalLM", ModelFamily::Qwen3_5Moe, false},
    {"Qwen3_5ForConditionalGeneration", ModelFamily::Qwen3_5, true},
    {"Qwen3_5ForCausalLM", ModelFamily::Qwen3_5, false},
};

std::string supported_archs() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

// Typed field access on one JSON object; `path` is the prefix used in messages ("" or "text_config.").
struct Fields {
  const json& obj;
  std::string path;
  const std::string& label;

  const json* find(const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  [[noreturn]] void wrong_type(const char* key, const json& v, const char* expected) const {
    fail(label, ": field '", path, key, "' is a JSON ", v.type_name(), ", expected ", expected);
  }
  int to_int(const char* key, const json& v) const {
    if (!v.is_number_integer()) wrong_type(key, v, "an integer");
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int>::max()))
        fail(label, ": field '", path, key, "' = ", u, " is out of range");
      return int(u);
    }
    int64_t i = v.get<int64_t>();
    if (i < std::numeric_limits<int>::min() || i > std::numeric_limits<int>::max())
      fail(label, ": field '", path, key, "' = ", i, " is out of range");
    return int(i);
  }
  std::optional<int> opt_int(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return to_int(key, *v);
  }
  int get_int(const char* key, int def) const { return opt_int(key).value_or(def); }
  void positive(const char* key, int v) const {
    if (v <= 0) fail(label, ": field '", path, key, "' must be positive, found ", v);
  }
  int req_int(const char* key) const {
    auto v = opt_int(key);
    if (!v) fail(label, ": missing required field '", path, key, "'");
    return *v;
  }
  std::optional<double> opt_double(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) wrong_type(key, *v, "a number");
    return v->get<double>();
  }
  std::optional<bool> opt_bool(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) wrong_type(key, *v, "a boolean");
    return v->get<bool>();
  }
  std::optional<std::string> opt_string(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong_type(key, *v, "a string");
    return v->get<std::string>();
  }
  // int or list of ints
  std::vector<int> int_list(const char* key) const {
    std::vector<int> out;
    const json* v = find(key);
    if (!v) return out;
    if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_number_integer()) wrong_type(key, *v, "an integer or a list of integers");
        out.push_back(to_int(key, e));
      }
    } else {
      if (!v->is_number_integer()) wrong_type(key, *v, "an integer or a list of integers");
      out.push_back(to_int(key, *v));
    }
    return out;
  }
};

json parse_object(const std::string& text, const std::string& label) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(label, ": not valid JSON");
  if (!j.is_object()) fail(label, ": expected a JSON object, found a JSON ", j.type_name());
  return j;
}


void add_unique(std::vector<int>& v, const std::vector<int>& add) {
  for (int x : add)
    if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

// Architecture -> family, weight prefix, vision tower.
void parse_architecture(const Fields& T, ModelConfig& c) {
  const std::string& label = T.label;
  const json* archs = T.find("architectures");
  if (!archs) fail(label, ": missing required field 'architectures' (supported: ", supported_archs(), ")");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    fail(label, ": field 'architectures' must be a non-empty list of strings");
  c.architecture = (*archs)[0].get<std::string>();
  const ArchInfo* arch = nullptr;
  for (const auto& a : kArchs)
    if (c.architecture == a.name) arch = &a;
  if (!arch)
    fail(label, ": unsupported architecture '", c.architecture, "' (supported: ", supported_archs(), ")");
  c.family = arch->family;
  c.weight_prefix = arch->multimodal ? "model.language_model." : "model.";
  c.has_vision = T.obj.contains("vision_config") && !T.obj["vision_config"].is_null();
}

// Widths, heads and depth, with transformers' defaults per family.
void parse_sizes(const Fields& F, ModelConfig& c) {
  const std::string& label = F.label;
  const bool qwen3 = c.family == ModelFamily::Qwen3, next = c.family == ModelFamily::Qwen3Next;
  c.model_type = F.opt_string("model_type").value_or("");
  c.hidden_size = F.req_int("hidden_size");
  c.num_hidden_layers = F.req_int("num_hidden_layers");
  c.vocab_size = F.req_int("vocab_size");
  c.num_attention_heads = F.req_int("num_attention_heads");
  F.positive("hidden_size", c.hidden_size);
  F.positive("num_hidden_layers", c.num_hidden_layers);
  F.positive("vocab_size", c.vocab_size);
  F.positive("num_attention_heads", c.num_attention_heads);
  if (c.num_hidden_layers > kMaxLayers)
    fail(label, ": field '", F.path, "num_hidden_layers' = ", c.num_hidden_layers, " is implausibly large");

  // transformers: Qwen3 turns a missing/None num_key_value_heads into num_attention_heads.
  int kv_default = qwen3 ? c.num_attention_heads : (c.family == ModelFamily::Qwen3_5 ? 4 : 2);
  c.num_key_value_heads = F.get_int("num_key_value_heads", kv_default);
  F.positive("num_key_value_heads", c.num_key_value_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail(label, ": num_attention_heads (", c.num_attention_heads, ") is not a multiple of num_key_value_heads (",
         c.num_key_value_heads, ")");
  c.head_dim = F.get_int("head_dim", qwen3 ? c.hidden_size / c.num_attention_heads : 256);
  F.positive("head_dim", c.head_dim);

  if (c.family == ModelFamily::Qwen3 || c.family == ModelFamily::Qwen3_5) {
    c.intermediate_size = F.req_int("intermediate_size");
    F.positive("intermediate_size", c.intermediate_size);
  } else if (next) {
    c.intermediate_size = F.get_int("intermediate_size", 5632);
  } else {
    c.intermediate_size = F.get_int("intermediate_size", 0);
  }
  c.max_position_embeddings = F.get_int("max_position_embeddings", 32768);
  c.rms_norm_eps = F.opt_double("rms_norm_eps").value_or(1e-6);
}

// layer_types (transformers' legacy names too), else Qwen3-Next's full_attention_interval.
void parse_layer_types(const Fields& F, ModelConfig& c) {
  const std::string& label = F.label;
  const bool hybrid = c.family != ModelFamily::Qwen3;
  c.layer_types.clear();
  if (const json* lt = F.find("layer_types")) {
    if (!lt->is_array()) F.wrong_type("layer_types", *lt, "a list of strings");
    if (lt->size() != size_t(c.num_hidden_layers))
      fail(label, ": field '", F.path, "layer_types' has ", lt->size(), " entries but num_hidden_layers is ",
           c.num_hidden_layers);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (!e.is_string()) F.wrong_type("layer_types", *lt, "a list of strings");
      std::string s = e.get<std::string>();
      if (s == "attention") s = "full_attention";  // transformers' legacy names
      if (s == "mamba" || s == "conv") s = "linear_attention";
      if (s == "full_attention") {
        c.layer_types.push_back(LayerType::FullAttention);
      } else if (s == "linear_attention" && hybrid) {
        c.layer_types.push_back(LayerType::LinearAttention);
      } else {
        fail(label, ": field '", F.path, "layer_types' entry ", i, " is '", s, "', unsupported for ",
             c.architecture, " (expected ", hybrid ? "full_attention or linear_attention" : "full_attention",
             ")");
      }
    }
  } else if (hybrid) {
    int interval = F.get_int("full_attention_interval", 4);
    if (interval <= 0) fail(label, ": field '", F.path, "full_attention_interval' must be positive, found ", interval);
    for (int i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  } else {
    c.layer_types.assign(size_t(c.num_hidden_layers), LayerType::FullAttention);
  }
}

void parse_gated_delta_net(const Fields& F, ModelConfig& c) {
  c.linear_num_key_heads = F.get_int("linear_num_key_heads", 16);
  c.linear_num_value_heads = F.get_int("linear_num_value_heads", 32);
  c.linear_key_head_dim = F.get_int("linear_key_head_dim", 128);
  c.linear_value_head_dim = F.get_int("linear_value_head_dim", 128);
  c.linear_conv_kernel_dim = F.get_int("linear_conv_kernel_dim", 4);
  F.positive("linear_num_key_heads", c.linear_num_key_heads);
  F.positive("linear_num_value_heads", c.linear_num_value_heads);
  F.positive("linear_key_head_dim", c.linear_key_head_dim);
  F.positive("linear_value_head_dim", c.linear_value_head_dim);
  F.positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    fail(F.label, ": linear_num_value_heads (", c.linear_num_value_heads,
         ") is not a multiple of linear_num_key_heads (", c.linear_num_key_heads, ")");
}

void parse_moe(const Fields& F, ModelConfig& c) {
  const std::string& label = F.label;
  c.num_experts = F.req_int("num_experts");
  c.num_experts_per_tok = F.req_int("num_experts_per_tok");
  c.moe_intermediate_size = F.req_int("moe_intermediate_size");
  c.shared_expert_intermediate_size = F.get_int("shared_expert_intermediate_size", 512);
  F.positive("num_experts", c.num_experts);
  F.positive("num_experts_per_tok", c.num_experts_per_tok);
  F.positive("moe_intermediate_size", c.moe_intermediate_size);
  if (c.shared_expert_intermediate_size < 0)
    fail(label, ": field '", F.path, "shared_expert_intermediate_size' must not be negative");
  if (c.num_experts_per_tok > c.num_experts)
    fail(label, ": num_experts_per_tok (", c.num_experts_per_tok, ") exceeds num_experts (", c.num_experts, ")");
  if (c.family != ModelFamily::Qwen3Next) {
    c.norm_topk_prob = true;  // Qwen3.5-MoE always renormalises the top-k weights
    return;
  }
  c.norm_topk_prob = F.opt_bool("norm_topk_prob").value_or(true);
  c.decoder_sparse_step = F.get_int("decoder_sparse_step", 1);
  F.positive("decoder_sparse_step", c.decoder_sparse_step);
  if (const json* ml = F.find("mlp_only_layers")) {
    if (!ml->is_array()) F.wrong_type("mlp_only_layers", *ml, "a list of integers");
    for (const auto& e : *ml) {
      if (!e.is_number_integer()) F.wrong_type("mlp_only_layers", *ml, "a list of integers");
      int v = F.to_int("mlp_only_layers", e);
      if (v < 0 || v >= c.num_hidden_layers)
        fail(label, ": field '", F.path, "mlp_only_layers' entry ", v, " is not a layer index");
      c.mlp_only_layers.push_back(v);
    }
  }
}

// RoPE: legacy rope_scaling (wins in transformers) or rope_parameters first, then top-level fields, then defaults.
void parse_rope(const Fields& F, ModelConfig& c) {
  const std::string& label = F.label;
  std::optional<double> theta, prf;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* rp = F.find(key);
    if (!rp) continue;
    if (!rp->is_object()) F.wrong_type(key, *rp, "an object");
    Fields R{*rp, F.path + key + ".", label};
    if (!theta) theta = R.opt_double("rope_theta");
    if (!prf) prf = R.opt_double("partial_rotary_factor");
  }
  if (!theta) theta = F.opt_double("rope_theta");
  if (!prf) prf = F.opt_double("partial_rotary_factor");
  c.rope_theta = theta.value_or(10000.0);
  c.partial_rotary_factor = prf.value_or(c.family == ModelFamily::Qwen3 ? 1.0 : 0.25);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) fail(label, ": rope_theta must be positive");
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1.0))
    fail(label, ": partial_rotary_factor must be in (0, 1], found ", c.partial_rotary_factor);
}

// Special tokens: the text config, the top level (`top`, when the text config is nested in it)
// and generation_config.json.
void parse_special_tokens(const Fields& F, const Fields* top, const std::string& generation_config_json,
                          ModelConfig& c) {
  const std::string& label = F.label;
  add_unique(c.eos_token_ids, F.int_list("eos_token_id"));
  if (top) add_unique(c.eos_token_ids, top->int_list("eos_token_id"));
  c.bos_token_id = F.opt_int("bos_token_id");
  if (!c.bos_token_id && top) c.bos_token_id = top->opt_int("bos_token_id");
  if (!generation_config_json.empty()) {
    const std::string glabel =
        label.size() >= 11 && label.ends_with("config.json")
            ? label.substr(0, label.size() - 11) + "generation_config.json"
            : label + " (generation_config.json)";
    json gen = parse_object(generation_config_json, glabel);
    Fields G{gen, "", glabel};
    add_unique(c.eos_token_ids, G.int_list("eos_token_id"));
    if (!c.bos_token_id) c.bos_token_id = G.opt_int("bos_token_id");
  }
}

}  // namespace

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::Qwen3: return "qwen3";
    case ModelFamily::Qwen3Next: return "qwen3_next";
    case ModelFamily::Qwen3_5Moe: return "qwen3_5_moe";
    case ModelFamily::Qwen3_5: return "qwen3_5";
  }
  return "?";
}

ModelConfig ModelConfig::load(const fs::path& dir) {
  std::error_code ec;
  const fs::path cfg = dir / "config.json";
  if (!fs::exists(cfg, ec)) fail(cfg.string(), ": not found (is ", dir.string(), " a model folder?)");
  std::string gen;
  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path, ec)) gen = read_text_file(gen_path);
  return parse(read_text_file(cfg), gen, cfg.string());
}

ModelConfig ModelConfig::parse(const std::string& config_json, const std::string& generation_config_json,
                               const std::string& label) {
  json top = parse_object(config_json, label);
  Fields T{top, "", label};
  ModelConfig c;
  parse_architecture(T, c);
  // Text config: nested or flat.
  const json* text_ptr = &top;
  std::string path;
  if (const json* tc = T.find("text_config")) {
    if (!tc->is_object()) T.wrong_type("text_config", *tc, "an object");
    text_ptr = tc;
    path = "text_config.";
  }
  const json& text = *text_ptr;
  Fields F{text, path, label};
  const bool nested = &text != &top;

  parse_sizes(F, c);
  parse_layer_types(F, c);
  if (c.family != ModelFamily::Qwen3) parse_gated_delta_net(F, c);
  if (c.family == ModelFamily::Qwen3_5Moe || c.family == ModelFamily::Qwen3Next) parse_moe(F, c);
  parse_rope(F, c);

  const bool qwen3 = c.family == ModelFamily::Qwen3;
  // transformers reads tie_word_embeddings from the top-level config (the model's own config);
  // for multimodal checkpoints that is the outer config, not text_config.
  c.tie_word_embeddings = T.opt_bool("tie_word_embeddings").value_or(false);
  c.attn_output_gate = qwen3 ? false : F.opt_bool("attn_output_gate").value_or(true);
  c.norm_zero_centered = !qwen3;

  auto mtp = F.opt_int("mtp_num_hidden_layers");
  if (!mtp && c.family == ModelFamily::Qwen3Next) mtp = F.opt_int("num_nextn_predict_layers");
  if (!mtp && nested) mtp = T.opt_int("mtp_num_hidden_layers");
  c.mtp_num_hidden_layers = mtp.value_or(0);
  if (c.mtp_num_hidden_layers < 0 || c.mtp_num_hidden_layers > kMaxLayers)
    fail(label, ": field 'mtp_num_hidden_layers' = ", c.mtp_num_hidden_layers, " is out of range");

  parse_special_tokens(F, nested ? &T : nullptr, generation_config_json, c);
  return c;
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts == 0) return false;
  if (family == ModelFamily::Qwen3Next) {
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
    return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
  }
  return true;
}

int ModelConfig::rotary_dim() const { return int(double(head_dim) * partial_rotary_factor); }

int ModelConfig::num_full_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::FullAttention));
}

int ModelConfig::num_linear_attention_layers() const {
  return int(std::count(layer_types.begin(), layer_types.end(), LayerType::LinearAttention));
}

int ModelConfig::attention_q_rows() const { return num_attention_heads * head_dim * (attn_output_gate ? 2 : 1); }
int ModelConfig::attention_kv_rows() const { return num_key_value_heads * head_dim; }
int ModelConfig::linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
int ModelConfig::linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
int ModelConfig::linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }

int64_t ModelConfig::linear_conv_state_values() const {
  return int64_t(linear_conv_kernel_dim - 1) * linear_conv_dim();
}

int64_t ModelConfig::linear_recurrent_state_values() const {
  return int64_t(linear_num_value_heads) * linear_key_head_dim * linear_value_head_dim;
}

int64_t ModelConfig::kv_bytes_per_token_per_layer(KvCacheDtype dtype) const {
  return 2LL * num_key_value_heads * head_dim * kv_cache_dtype_bytes(dtype);
}

ModelConfig ModelConfig::truncated_to(int layers) const {
  ModelConfig c = *this;
  if (layers > 0 && layers < num_hidden_layers) {
    c.num_hidden_layers = layers;
    c.layer_types.resize(size_t(layers));
  }
  return c;
}

}  // namespace fathom
