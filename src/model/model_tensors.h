// The one description of the text model's tensors: every checkpoint name, its shape as stored,
// and what kind of module it belongs to. The CPU loader (model_weights.cpp), the CUDA streaming
// loader (cuda/device_weights_stream.cpp) and the dummy-weight builder
// (cuda/device_weights_dummy.cpp) all take names and shapes from here, so a new checkpoint layout
// (another wrapper prefix, another fused projection) or a new storage format by module kind
// changes this file, not three loaders.
//
// Shapes are the config's: the whole model's for a whole config, one rank's for rank_config.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace fathom {

// What a linear module does: where a storage format is chosen per kind (NVFP4 routed experts,
// bf16 routers, ...) this is the key.
enum class ModuleKind {
  LmHead,
  Attention,        // q, k, v, o projections
  LinearAttention,  // Gated DeltaNet projections
  Router,           // the MoE router (kept fp32 on the GPU)
  RoutedExpert,
  SharedExpert,
  SharedExpertGate,  // the shared expert's [1, hidden] gate logit
  DenseMlp,
  MtpInput,  // mtp.fc
};

const char* module_kind_name(ModuleKind k);  // "attention", "routed expert", ...

// A tensor as a checkpoint stores it.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// A linear module: `<module>.weight` of [out, in] in a float type, or NVFP4 (`.weight` U8
// [out, in/2], `.weight_scale` E4M3 [out, in/16], `.weight_scale_2`).
struct LinearSpec {
  std::string module;
  int out = 0, in = 0;
  ModuleKind kind = ModuleKind::Attention;
  std::string weight() const { return module + ".weight"; }
};

struct MlpTensors {  // SwiGLU
  LinearSpec gate, up, down;
};

struct AttentionTensors {
  LinearSpec q, k, v, o;  // q: attention_q_rows() (query and gate rows per head when gated)
  TensorSpec q_norm, k_norm;
  // The FP8 KV cache's per-tensor scales (fp32 scalars, `k_proj.k_scale`, `v_proj.v_scale`):
  // optional, 1 when absent (kv_cache_scales.h).
  std::string k_scale, v_scale;
};

struct GatedDeltaNetTensors {
  // Qwen3.5 stores [Q | K | V], Z, B and A as four projections; Qwen3-Next fuses them per key
  // head (in_proj_qkvz, in_proj_ba), and the loaders reorder those rows to the Qwen3.5 layout.
  bool fused_per_key_head = false;
  LinearSpec qkv, z, b, a;  // the Qwen3.5 projections (the layout every engine computes with)
  LinearSpec qkvz, ba;      // Qwen3-Next's stored projections, when fused_per_key_head
  LinearSpec out;
  TensorSpec conv;  // [conv_dim, 1, kernel]
  TensorSpec dt_bias, a_log, norm;
};

struct MoeTensors {
  LinearSpec router;  // [experts, hidden]
  // Routed experts are stored fused ([E, 2I, H] gate_up_proj and [E, H, I] down_proj) or one
  // module per expert (expert(e)).
  std::string experts;  // the modules' common prefix
  TensorSpec fused_gate_up, fused_down;
  int moe_intermediate = 0, hidden = 0;
  MlpTensors expert(int e) const;
  bool has_shared = false;
  MlpTensors shared;
  LinearSpec shared_gate;  // [1, hidden]
};

struct LayerTensors {
  std::string prefix;  // e.g. "model.language_model.layers.3"
  LayerType type = LayerType::FullAttention;
  TensorSpec input_norm, post_attention_norm;
  AttentionTensors attn;     // when FullAttention
  GatedDeltaNetTensors gdn;  // when LinearAttention
  bool is_moe = false;
  MoeTensors moe;  // when is_moe
  MlpTensors mlp;  // when !is_moe
};

struct MtpTensors {
  LinearSpec fc;  // [hidden, 2 * hidden] over [norm(embedding) | norm(hidden)]
  TensorSpec pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerTensors layer;  // one full-attention layer, MoE when the model is
};

struct ModelTensors {
  TensorSpec embed, final_norm;
  LinearSpec lm_head;  // absent from tied checkpoints
  std::vector<LayerTensors> layers;
  std::optional<MtpTensors> mtp;  // when the config declares an MTP layer
};

ModelTensors model_tensors(const ModelConfig& cfg);
// Every linear module of the model as the checkpoint stores it (Qwen3-Next's fused DeltaNet
// projections rather than their Qwen3.5 split, routed experts per expert; fused 3-D expert tensors
// are not modules), the lm_head and the MTP layer's included.
std::vector<LinearSpec> stored_linear_modules(const ModelTensors& t);
// One decoder layer's tensors under `prefix`.
LayerTensors layer_tensors(const ModelConfig& cfg, const std::string& prefix, LayerType type, bool is_moe);

}  // namespace fathom
