#include "model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/dtype.h"
#include "io/safetensors_writer.h"
#include "model/seeded_random.h"

namespace fathom::testutil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Tensors

// NVFP4 test values (ModelOpt layout): random E2M1 codes (rms ~2.9), E4M3 block scales near 1
// (0x30..0x3f = 0.5..1.875) and a global scale of ~1/(3 sqrt(in)), so the dequantized weight has
// ~1/sqrt(in) spread like the BF16 ones. input_scale is ModelOpt's amax / (6 * 448) for
// activations up to kActivationAmax (the W4A4 kernels quantize with it; the CPU engine ignores it).
constexpr float kActivationAmax = 16.f;

// Where a tensor is written: a numbered shard, or mtp.safetensors (Qwen3.5 releases keep it apart).
constexpr int kMtpFile = -1;

class TensorSet {
 public:
  explicit TensorSet(uint64_t seed) : r_(seed * 0x9E3779B97F4A7C15ull + 0x51EEDull) {}

  void set_file(int file) { file_ = file; }

  void bf16(const std::string& name, std::vector<int64_t> shape, float stddev, float mean = 0.f) {
    std::vector<uint16_t> v(size_t(numel(shape)));
    for (auto& x : v) x = f32_to_bf16(mean + stddev * r_.normal());
    add({name, "BF16", std::move(shape), as_bytes(v)});
  }
  void bf16_values(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    add({name, "BF16", std::move(shape), testutil::bf16_bytes(v)});
  }
  void f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    add({name, "F32", std::move(shape), as_bytes(v)});
  }
  // RMSNorm gain ~1: w ~ N(0, 0.1) where the model applies 1 + w, else 1 + N(0, 0.1).
  void norm(const std::string& name, int n, bool zero_centred) { bf16(name, {n}, 0.1f, zero_centred ? 0.f : 1.f); }

  void linear(const std::string& module, int out, int in, bool nvfp4) {
    if (nvfp4)
      nvfp4_linear(module, out, in, global_scale(in), input_scale());
    else
      bf16(module + ".weight", {out, in}, 1.f / std::sqrt(float(in)));
  }
  void nvfp4_linear(const std::string& module, int out, int in, float global, float input) {
    std::vector<uint8_t> codes(size_t(out) * in / 2), scales(size_t(out) * in / 16);
    for (auto& b : codes) b = r_.byte();
    for (auto& b : scales) b = uint8_t(0x30 + (r_.byte() & 0x0f));
    add({module + ".weight", "U8", {out, in / 2}, std::move(codes)});
    add({module + ".weight_scale", "F8_E4M3", {out, in / 16}, std::move(scales)});
    f32(module + ".weight_scale_2", {}, {global});
    f32(module + ".input_scale", {}, {input});
  }
  std::vector<float> uniform_values(int n, double lo, double hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = float(r_.uniform(lo, hi));
    return v;
  }
  float global_scale(int in) { return float(r_.uniform(0.8, 1.25) / (3.0 * std::sqrt(double(in)))); }
  float input_scale() { return float(r_.uniform(0.8, 1.25)) * kActivationAmax / (6.f * 448.f); }

  const std::map<int, std::vector<TensorSpec>>& files() const { return files_; }

 private:
  static int64_t numel(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  void add(TensorSpec t) { files_[file_].push_back(std::move(t)); }

  SeededRandom r_;
  int file_ = 0;
  std::map<int, std::vector<TensorSpec>> files_;
};

// ---------------------------------------------------------------------------------------------
// The checkpoint's tensors, in the layout of the real releases

class ModelTensors {
 public:
  ModelTensors(const SweepConfig& c, TensorSet& t) : c_(c), t_(t) {}

  void write_all() {
    const std::string P = prefix();
    const int shards = shard_count();
    t_.set_file(0);
    if (c_.arch == SweepArch::Qwen35Moe) vision_tower();
    // Tied: lm_head reads the embedding, so it gets lm_head's scale (logits ~N(0, 1)).
    const float embed_std = c_.tie_word_embeddings ? 1.f / std::sqrt(float(c_.hidden)) : 1.f;
    t_.bf16(P + "embed_tokens.weight", {c_.vocab, c_.hidden}, embed_std);
    for (int l = 0; l < c_.layers(); ++l) {
      t_.set_file(l * shards / c_.layers());
      layer(P + "layers." + std::to_string(l), c_.layer_pattern[size_t(l)] == 'F', c_.moe() && !is_mlp_only(c_, l),
            false);
    }
    t_.set_file(shards - 1);
    t_.norm(P + "norm.weight", c_.hidden, zero_centred());
    if (!c_.tie_word_embeddings) t_.linear("lm_head", c_.vocab, c_.hidden, false);
    if (c_.mtp) {
      // Qwen3.5 releases ship the MTP layer in mtp.safetensors; Qwen3-Next's sits in the shards.
      if (c_.arch == SweepArch::Qwen35Moe) t_.set_file(kMtpFile);
      t_.linear("mtp.fc", c_.hidden, 2 * c_.hidden, false);
      t_.norm("mtp.pre_fc_norm_embedding.weight", c_.hidden, true);
      t_.norm("mtp.pre_fc_norm_hidden.weight", c_.hidden, true);
      layer("mtp.layers.0", true, true, true);
      t_.norm("mtp.norm.weight", c_.hidden, true);
    }
  }

  std::string prefix() const { return c_.arch == SweepArch::Qwen35Moe ? "model.language_model." : "model."; }
  // Dense Qwen3 in one model.safetensors (like the small releases); the MoE models in shards.
  int shard_count() const { return c_.arch == SweepArch::Qwen3Dense ? 1 : std::min(c_.layers(), 3); }

 private:
  enum class Part { Attention, DeltaNet, RoutedExperts, SharedExpert, DenseMlp };

  bool zero_centred() const { return c_.hybrid(); }

  // Which linears are NVFP4. The releases (and tests/fixtures/qwen35_moe_nvfp4) quantize the
  // routed and shared experts of the main layers only; "all" also takes attention, DeltaNet and
  // the MTP layer. Routers, shared_expert_gate, mtp.fc and lm_head stay BF16 in every mode.
  bool nvfp4(Part part, bool in_mtp) const {
    switch (c_.quant) {
      case SweepQuant::Bf16: return false;
      case SweepQuant::Nvfp4All: return true;
      case SweepQuant::Nvfp4Experts:
        return !in_mtp && (part == Part::RoutedExperts || part == Part::SharedExpert || part == Part::DenseMlp);
    }
    return false;
  }

  void layer(const std::string& p, bool full_attention, bool moe, bool in_mtp) {
    t_.norm(p + ".input_layernorm.weight", c_.hidden, zero_centred());
    t_.norm(p + ".post_attention_layernorm.weight", c_.hidden, zero_centred());
    if (full_attention)
      attention(p + ".self_attn", nvfp4(Part::Attention, in_mtp));
    else
      delta_net(p + ".linear_attn", nvfp4(Part::DeltaNet, in_mtp));
    if (moe) {
      t_.linear(p + ".mlp.gate", c_.experts, c_.hidden, false);
      routed_experts(p + ".mlp.experts", nvfp4(Part::RoutedExperts, in_mtp));
      if (c_.shared_intermediate > 0) {
        mlp(p + ".mlp.shared_expert", c_.shared_intermediate, nvfp4(Part::SharedExpert, in_mtp));
        t_.linear(p + ".mlp.shared_expert_gate", 1, c_.hidden, false);
      }
    } else {
      mlp(p + ".mlp", c_.intermediate, nvfp4(Part::DenseMlp, in_mtp));
    }
  }

  void attention(const std::string& p, bool fp4) {
    const int q = c_.heads * c_.head_dim, kv = c_.kv_heads * c_.head_dim;
    t_.linear(p + ".q_proj", q * (c_.attn_output_gate ? 2 : 1), c_.hidden, fp4);
    t_.linear(p + ".k_proj", kv, c_.hidden, fp4);
    t_.linear(p + ".v_proj", kv, c_.hidden, fp4);
    t_.linear(p + ".o_proj", c_.hidden, q, fp4);
    t_.norm(p + ".q_norm.weight", c_.head_dim, zero_centred());
    t_.norm(p + ".k_norm.weight", c_.head_dim, zero_centred());
  }

  void delta_net(const std::string& p, bool fp4) {
    const int hv = c_.linear_value_heads, key = c_.linear_key_heads * c_.linear_key_dim,
              value = hv * c_.linear_value_dim, conv = 2 * key + value;
    if (c_.arch == SweepArch::Qwen3Next) {  // fused, grouped per key head (the loader regroups)
      t_.linear(p + ".in_proj_qkvz", 2 * key + 2 * value, c_.hidden, fp4);
      t_.linear(p + ".in_proj_ba", 2 * hv, c_.hidden, fp4);
    } else {
      t_.linear(p + ".in_proj_qkv", conv, c_.hidden, fp4);
      t_.linear(p + ".in_proj_z", value, c_.hidden, fp4);
      t_.linear(p + ".in_proj_b", hv, c_.hidden, fp4);
      t_.linear(p + ".in_proj_a", hv, c_.hidden, fp4);
    }
    t_.bf16(p + ".conv1d.weight", {conv, 1, c_.conv_kernel}, 0.5f);
    // dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1] (transformers' init): the decay
    // exp(-A softplus(a + dt_bias)) then keeps a state over several tokens (with dt_bias near 0 a
    // head would forget within a token or two, and chunked prefill would test little).
    std::vector<float> dt_bias = t_.uniform_values(hv, std::log(1e-3), std::log(0.1));
    for (auto& x : dt_bias) x = std::exp(x) + std::log(-std::expm1(-std::exp(x)));
    t_.bf16_values(p + ".dt_bias", {hv}, dt_bias);
    std::vector<float> a_log = t_.uniform_values(hv, 1.0, 16.0);
    for (auto& x : a_log) x = std::log(x);
    t_.f32(p + ".A_log", {hv}, a_log);  // F32, as in the releases
    t_.norm(p + ".norm.weight", c_.linear_value_dim, false);  // the gated norm scales by w, not 1 + w
    t_.linear(p + ".out_proj", c_.hidden, value, fp4);
  }

  void mlp(const std::string& p, int inter, bool fp4) {
    if (!fp4) {
      t_.linear(p + ".gate_proj", inter, c_.hidden, false);
      t_.linear(p + ".up_proj", inter, c_.hidden, false);
      t_.linear(p + ".down_proj", c_.hidden, inter, false);
      return;
    }
    // ModelOpt exports gate and up of one MLP with one global scale (engines fuse them).
    const float gate_up = t_.global_scale(c_.hidden), in = t_.input_scale();
    t_.nvfp4_linear(p + ".gate_proj", inter, c_.hidden, gate_up, in);
    t_.nvfp4_linear(p + ".up_proj", inter, c_.hidden, gate_up, in);
    t_.nvfp4_linear(p + ".down_proj", c_.hidden, inter, t_.global_scale(inter), t_.input_scale());
  }

  void routed_experts(const std::string& p, bool fp4) {
    const int E = c_.experts, I = c_.moe_intermediate, H = c_.hidden;
    if (c_.arch == SweepArch::Qwen35Moe && c_.quant == SweepQuant::Bf16) {
      // transformers 5.x's fused Qwen3.5 experts: [E, 2I, H] (gate rows, then up rows), [E, H, I].
      t_.bf16(p + ".gate_up_proj", {E, 2 * I, H}, 1.f / std::sqrt(float(H)));
      t_.bf16(p + ".down_proj", {E, H, I}, 1.f / std::sqrt(float(I)));
      return;
    }
    if (!fp4) {
      for (int e = 0; e < E; ++e) mlp(p + "." + std::to_string(e), I, false);
      return;
    }
    // ModelOpt's expert export: one input_scale per projection for all experts of a layer.
    const float in_gate_up = t_.input_scale(), in_down = t_.input_scale();
    for (int e = 0; e < E; ++e) {
      const std::string q = p + "." + std::to_string(e);
      const float gate_up = t_.global_scale(H);
      t_.nvfp4_linear(q + ".gate_proj", I, H, gate_up, in_gate_up);
      t_.nvfp4_linear(q + ".up_proj", I, H, gate_up, in_gate_up);
      t_.nvfp4_linear(q + ".down_proj", H, I, t_.global_scale(I), in_down);
    }
  }

  // The Qwen3.5 release's vision tower, at the fixture's size: the text engines skip it, but a
  // multimodal checkpoint without it would not be the release's layout.
  void vision_tower() {
    const int v = 16, merged = v * 4;
    const float s = 0.02f;
    t_.bf16("model.visual.patch_embed.proj.weight", {v, 3, 2, 4, 4}, s);
    t_.bf16("model.visual.patch_embed.proj.bias", {v}, s);
    t_.bf16("model.visual.pos_embed.weight", {16, v}, s);
    const std::string b = "model.visual.blocks.0.";
    for (const char* n : {"norm1", "norm2"}) {
      t_.bf16(b + n + ".weight", {v}, 0.f, 1.f);
      t_.bf16(b + n + ".bias", {v}, 0.f);
    }
    t_.bf16(b + "attn.qkv.weight", {3 * v, v}, s);
    t_.bf16(b + "attn.qkv.bias", {3 * v}, s);
    t_.bf16(b + "attn.proj.weight", {v, v}, s);
    t_.bf16(b + "attn.proj.bias", {v}, s);
    t_.bf16(b + "mlp.linear_fc1.weight", {2 * v, v}, s);
    t_.bf16(b + "mlp.linear_fc1.bias", {2 * v}, s);
    t_.bf16(b + "mlp.linear_fc2.weight", {v, 2 * v}, s);
    t_.bf16(b + "mlp.linear_fc2.bias", {v}, s);
    t_.bf16("model.visual.merger.norm.weight", {v}, 0.f, 1.f);
    t_.bf16("model.visual.merger.norm.bias", {v}, 0.f);
    t_.bf16("model.visual.merger.linear_fc1.weight", {merged, merged}, s);
    t_.bf16("model.visual.merger.linear_fc1.bias", {merged}, s);
    t_.bf16("model.visual.merger.linear_fc2.weight", {c_.hidden, merged}, s);
    t_.bf16("model.visual.merger.linear_fc2.bias", {c_.hidden}, s);
  }

  const SweepConfig& c_;
  TensorSet& t_;
};

// ---------------------------------------------------------------------------------------------
// config.json and the quantization files, as transformers 5.x and ModelOpt write them

json layer_types(const SweepConfig& c) {
  json t = json::array();
  for (char ch : c.layer_pattern) t.push_back(ch == 'F' ? "full_attention" : "linear_attention");
  return t;
}

// Keys every transformers 5.x text config of these families carries.
void common_text_fields(const SweepConfig& c, json& t) {
  t["attention_bias"] = false;
  t["attention_dropout"] = 0.0;
  t["bos_token_id"] = nullptr;
  t["eos_token_id"] = 1;
  t["head_dim"] = c.head_dim;
  t["hidden_act"] = "silu";
  t["hidden_size"] = c.hidden;
  t["initializer_range"] = 0.02;
  t["layer_types"] = layer_types(c);
  t["max_position_embeddings"] = 4096;
  t["num_attention_heads"] = c.heads;
  t["num_hidden_layers"] = c.layers();
  t["num_key_value_heads"] = c.kv_heads;
  t["pad_token_id"] = nullptr;
  t["rms_norm_eps"] = 1e-06;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["use_cache"] = true;
  t["vocab_size"] = c.vocab;
}

void hybrid_text_fields(const SweepConfig& c, json& t) {
  t["linear_conv_kernel_dim"] = c.conv_kernel;
  t["linear_key_head_dim"] = c.linear_key_dim;
  t["linear_num_key_heads"] = c.linear_key_heads;
  t["linear_num_value_heads"] = c.linear_value_heads;
  t["linear_value_head_dim"] = c.linear_value_dim;
  t["moe_intermediate_size"] = c.moe_intermediate;
  t["num_experts"] = c.experts;
  t["num_experts_per_tok"] = c.top_k;
  t["output_router_logits"] = false;
  t["partial_rotary_factor"] = c.partial_rotary_factor;
  t["router_aux_loss_coef"] = 0.001;
  t["shared_expert_intermediate_size"] = c.shared_intermediate;
}

json qwen35_config(const SweepConfig& c) {
  json t;
  common_text_fields(c, t);
  hybrid_text_fields(c, t);
  t["model_type"] = "qwen3_5_moe_text";
  t["mtp_num_hidden_layers"] = c.mtp ? 1 : 0;
  t["mtp_use_dedicated_embeddings"] = false;
  // Multimodal RoPE sections (text positions make them plain RoPE); they sum to rotary_dim / 2.
  const int half = int(c.head_dim * c.partial_rotary_factor) / 2, third = half / 3;
  t["rope_parameters"] = {{"mrope_interleaved", true},
                          {"mrope_section", {half - 2 * third, third, third}},
                          {"partial_rotary_factor", c.partial_rotary_factor},
                          {"rope_theta", c.rope_theta},
                          {"rope_type", "default"}};
  json vision = {{"depth", 1},
                 {"hidden_act", "gelu_pytorch_tanh"},
                 {"hidden_size", 16},
                 {"in_channels", 3},
                 {"initializer_range", 0.02},
                 {"intermediate_size", 32},
                 {"model_type", "qwen3_5_moe_vision"},
                 {"num_heads", 2},
                 {"num_position_embeddings", 16},
                 {"out_hidden_size", c.hidden},
                 {"patch_size", 4},
                 {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "axial"}}},
                 {"spatial_merge_size", 2},
                 {"temporal_patch_size", 2}};
  return {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"dtype", "bfloat16"},
          {"image_token_id", 248056},
          {"model_type", "qwen3_5_moe"},
          {"text_config", t},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"transformers_version", "5.17.0"},
          {"video_token_id", 248057},
          {"vision_config", vision},
          {"vision_end_token_id", 248054},
          {"vision_start_token_id", 248053}};
}

json qwen3_next_config(const SweepConfig& c) {
  json t;
  common_text_fields(c, t);
  hybrid_text_fields(c, t);
  t["architectures"] = {"Qwen3NextForCausalLM"};
  t["decoder_sparse_step"] = 1;
  t["dtype"] = "bfloat16";
  t["intermediate_size"] = c.intermediate;
  t["mlp_only_layers"] = c.mlp_only_layers;
  t["model_type"] = "qwen3_next";
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["rope_parameters"] = {{"partial_rotary_factor", c.partial_rotary_factor},
                          {"rope_theta", c.rope_theta},
                          {"rope_type", "default"}};
  t["transformers_version"] = "5.17.0";
  // The release ships mtp.* without declaring it; declared here so that the engines load it.
  if (c.mtp) t["num_nextn_predict_layers"] = 1;
  return t;
}

json qwen3_dense_config(const SweepConfig& c) {
  json t;
  common_text_fields(c, t);
  t["architectures"] = {"Qwen3ForCausalLM"};
  t["dtype"] = "bfloat16";
  t["intermediate_size"] = c.intermediate;
  t["max_window_layers"] = 28;
  t["model_type"] = "qwen3";
  t["rope_parameters"] = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};
  t["sliding_window"] = nullptr;
  t["transformers_version"] = "5.17.0";
  t["use_sliding_window"] = false;
  return t;
}

// Modules left in BF16, as ModelOpt lists them. Routers, shared_expert_gate and mtp.fc are left
// out of the experts-only list as in the real exports (engines know to keep them BF16).
std::vector<std::string> exclude_modules(const SweepConfig& c, const std::string& prefix) {
  std::vector<std::string> ex = {"lm_head"};
  if (c.quant == SweepQuant::Nvfp4Experts) {
    ex.push_back(prefix + "layers.*.linear_attn*");
    ex.push_back(prefix + "layers.*.self_attn*");
    if (c.arch == SweepArch::Qwen3Next) ex.push_back(prefix + "layers.*.mlp.gate");
  } else if (c.moe()) {
    ex.push_back("*.mlp.gate");
    ex.push_back("*.shared_expert_gate");
    if (c.mtp) ex.push_back("mtp.fc");
  }
  if (c.arch == SweepArch::Qwen35Moe) ex.push_back("model.visual*");
  if (c.mtp && c.quant == SweepQuant::Nvfp4Experts) ex.push_back("mtp.layers.0*");
  return ex;
}

json hf_quant_config(const std::vector<std::string>& exclude) {
  return {{"producer", {{"name", "modelopt"}, {"version", "0.x"}}},
          {"quantization",
           {{"quant_algo", "NVFP4"},
            {"kv_cache_quant_algo", nullptr},
            {"group_size", 16},
            {"exclude_modules", exclude}}}};
}

json config_quantization(const std::vector<std::string>& exclude) {
  const json fp4 = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  return {{"config_groups", {{"group_0", {{"input_activations", fp4}, {"weights", fp4}, {"targets", {"Linear"}}}}}},
          {"ignore", exclude},
          {"quant_algo", "NVFP4"},
          {"kv_cache_scheme", nullptr},
          {"producer", {{"name", "modelopt"}, {"version", "0.x"}}},
          {"quant_method", "modelopt"}};
}

json generation_config() {
  return {{"_from_model_config", true},
          {"eos_token_id", 1},
          {"output_attentions", false},
          {"output_hidden_states", false},
          {"transformers_version", "5.17.0"},
          {"use_cache", true}};
}

void write_json(const fs::path& p, const json& j) { write_text(p, j.dump(2) + "\n"); }

std::string shard_name(int file, int shards) {
  if (file == kMtpFile) return "mtp.safetensors";
  if (shards == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", file + 1, shards);
  return buf;
}

int64_t dtype_bytes(const std::string& name) { return int64_t(dtype_size(*parse_dtype(name))); }

}  // namespace

// ---------------------------------------------------------------------------------------------

void write_random_checkpoint(const SweepConfig& cfg, const fs::path& dir) {
  if (std::string why = sweep_config_problem(cfg); !why.empty())
    throw std::invalid_argument("write_random_checkpoint(" + cfg.describe() + "): " + why);
  fs::create_directories(dir);
  TensorSet tensors(cfg.seed);
  ModelTensors model(cfg, tensors);
  model.write_all();

  const int shards = model.shard_count();
  json weight_map = json::object();
  int64_t total_bytes = 0;
  for (const auto& [file, list] : tensors.files()) {
    // Widest dtypes first, then by name (as safetensors' own writer does): every tensor aligned.
    std::vector<TensorSpec> sorted = list;
    std::sort(sorted.begin(), sorted.end(), [](const TensorSpec& a, const TensorSpec& b) {
      const int64_t wa = dtype_bytes(a.dtype), wb = dtype_bytes(b.dtype);
      return wa != wb ? wa > wb : a.name < b.name;
    });
    const std::string name = shard_name(file, shards);
    for (const auto& t : sorted) {
      weight_map[t.name] = name;
      total_bytes += int64_t(t.data.size());
    }
    write_bytes(dir / name, build_safetensors(sorted, {{"format", "pt"}}));
  }
  if (tensors.files().size() > 1)
    write_json(dir / "model.safetensors.index.json",
               {{"metadata", {{"total_parameters", cfg.parameters()}, {"total_size", total_bytes}}},
                {"weight_map", weight_map}});

  json config = cfg.arch == SweepArch::Qwen35Moe   ? qwen35_config(cfg)
                : cfg.arch == SweepArch::Qwen3Next ? qwen3_next_config(cfg)
                                                   : qwen3_dense_config(cfg);
  if (cfg.quant != SweepQuant::Bf16) {
    const auto exclude = exclude_modules(cfg, model.prefix());
    config["quantization_config"] = config_quantization(exclude);
    write_json(dir / "hf_quant_config.json", hf_quant_config(exclude));
  }
  write_json(dir / "config.json", config);
  write_json(dir / "generation_config.json", generation_config());
}

}  // namespace fathom::testutil
