// The text model's hyper-parameters from a Hugging Face config.json (nested text_config or
// flat) and generation_config.json, normalised across Qwen3, Qwen3-Next, Qwen3.5(-MoE).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/kv_cache_dtype.h"

namespace fathom {

enum class ModelFamily {
  Qwen3,       // dense Qwen3ForCausalLM: plain RMSNorm, ungated attention, full RoPE
  Qwen3Next,   // Qwen3NextForCausalLM: fused in_proj_qkvz / in_proj_ba
  Qwen3_5Moe,  // Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM
  Qwen3_5,     // dense Qwen3.5 (Qwen3_5ForConditionalGeneration / Qwen3_5ForCausalLM)
};

enum class LayerType { FullAttention, LinearAttention };

struct ModelConfig {
  std::string architecture;  // architectures[0]
  std::string model_type;    // of the text config
  ModelFamily family = ModelFamily::Qwen3;
  // Prefix of the language-model tensors: "model.language_model." (multimodal) or "model.".
  std::string weight_prefix = "model.";
  bool has_vision = false;

  int hidden_size = 0;
  int num_hidden_layers = 0;
  int vocab_size = 0;
  int intermediate_size = 0;  // dense MLP width (Qwen3, Qwen3.5 dense, Qwen3-Next mlp_only layers)
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  std::vector<LayerType> layer_types;

  // Gated DeltaNet
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;

  // MoE (num_experts == 0 means a dense MLP)
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attn_output_gate = false;      // q_proj also produces a sigmoid gate per head
  bool norm_zero_centered = false;    // RMSNorm scales by (1 + w) instead of w

  int mtp_num_hidden_layers = 0;

  std::vector<int> eos_token_ids;  // config + generation_config, deduplicated
  std::optional<int> bos_token_id;

  // Parses config.json (and generation_config.json when present) in `dir`.
  static ModelConfig load(const std::filesystem::path& dir);
  // Parses config text; `generation_config` may be empty. `label` names the source in errors.
  static ModelConfig parse(const std::string& config_json, const std::string& generation_config_json,
                           const std::string& label);

  bool is_moe_layer(int layer) const;
  // The same model cut to its first `layers` layers (the layer pattern is kept; the MTP layer
  // stays, for dummy-weight benchmarks of speculative decoding).
  ModelConfig truncated_to(int layers) const;
  int rotary_dim() const;  // head_dim * partial_rotary_factor
  int num_full_attention_layers() const;
  int num_linear_attention_layers() const;

  // Sizes derived from the hyper-parameters, computed here only. A tensor-parallel rank's config
  // (rank_config) gives the rank's share.
  int attention_q_rows() const;  // q_proj rows: each head's query, and its gate rows when gated
  int attention_kv_rows() const;  // k_proj / v_proj rows
  int linear_key_dim() const;    // Gated DeltaNet key heads x key head dim
  int linear_value_dim() const;  // value heads x value head dim
  int linear_conv_dim() const;   // convolution channels, [Q | K | V]
  // One sequence's Gated DeltaNet state in one layer, in values: the convolution window (the
  // last kernel - 1 inputs) and the recurrent state (a dk x dv matrix per value head).
  int64_t linear_conv_state_values() const;
  int64_t linear_recurrent_state_values() const;
  // K and V of one token in one full-attention layer, in bytes of the cache's dtype: what every
  // KV budget (pools, snapshots, plans) is sized from.
  int64_t kv_bytes_per_token_per_layer(KvCacheDtype dtype) const;
};

const char* family_name(ModelFamily f);

}  // namespace fathom
