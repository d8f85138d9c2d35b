// Weights of the text model (and its MTP layer) as fp32 host arrays, the form the CPU
// reference backend computes with. NVFP4 tensors are dequantized exactly at load time.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "model/tensor_split.h"

namespace fathom {

// A Linear layer: w is [out, in] row-major, y = x * w^T (dequantized exactly when stored NVFP4 or
// FP8; `quantized` records that). A W8A8 FP8 layer (input_scale > 0) quantizes its input first,
// x -> e4m3(x * (1 / input_scale)) * input_scale, as the GPU's FP8 tensor cores see it.
// When loaded with keep_nvfp4, an NVFP4 layer keeps its raw codes and scales instead of `w`.
struct LinearWeight {
  int out = 0, in = 0;
  std::vector<float> w;
  bool quantized = false;
  bool fp8 = false;        // stored FP8
  bool fp8_block = false;  // FP8 with 128 x 128 block scales
  bool fp8_per_row = false;  // FP8 with a scale per row (the CUDA engine keeps routed experts of this kind in bf16)
  float input_scale = 0.f;
  std::vector<uint8_t> fp4;        // [out, in/2] packed E2M1 (keep_nvfp4 only)
  std::vector<uint8_t> fp4_scale;  // [out, in/16] E4M3
  float fp4_global = 1.f;
};

struct MlpWeights {  // SwiGLU: down(silu(gate(x)) * up(x))
  LinearWeight gate, up, down;
};

struct AttentionWeights {
  LinearWeight q, k, v, o;  // q has 2*head_dim rows per head when the output gate is on
  std::vector<float> q_norm, k_norm;
  // The FP8 KV cache's per-tensor scales (k_proj.k_scale, v_proj.v_scale; 1 when the checkpoint
  // has none); unused with a bf16 cache.
  float k_scale = 1.f, v_scale = 1.f;
};

struct GatedDeltaNetWeights {
  LinearWeight qkv;  // rows [Q | K | V] (Qwen3-Next's per-key-head interleaving is undone at load)
  LinearWeight z;    // output gate, [value_dim, hidden]
  LinearWeight b;    // beta logits, [HV, hidden]
  LinearWeight a;    // decay input, [HV, hidden]
  LinearWeight out;
  std::vector<float> conv;  // [conv_dim, kernel]
  std::vector<float> dt_bias, a_log, norm;
};

struct MoeWeights {
  LinearWeight router;               // [E, hidden]
  std::vector<MlpWeights> experts;   // E
  std::optional<MlpWeights> shared;  // shared expert
  LinearWeight shared_gate;          // [1, hidden]
};

struct LayerWeights {
  LayerType type = LayerType::FullAttention;
  std::vector<float> input_norm, post_attention_norm;
  AttentionWeights attn;     // when FullAttention
  GatedDeltaNetWeights gdn;  // when LinearAttention
  bool is_moe = false;
  MoeWeights moe;
  MlpWeights mlp;  // when !is_moe
};

struct MtpWeights {
  LinearWeight fc;  // [hidden, 2*hidden], input = [norm(embedding) | norm(hidden)]
  std::vector<float> pre_fc_norm_embedding, pre_fc_norm_hidden, norm;
  LayerWeights layer;  // always full attention
};

struct ModelWeights {
  std::vector<float> embed;  // [vocab, hidden]
  std::vector<float> final_norm;
  LinearWeight lm_head;      // empty `w` when tied to `embed`
  bool tied_lm_head = false;
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;

  const float* lm_head_data() const { return tied_lm_head ? embed.data() : lm_head.w.data(); }
};

// Loads and validates every tensor the text model needs. `load_mtp` also loads the `mtp.*`
// layer when the config declares one. Throws fathom::Error naming the tensor on any mismatch.
// keep_nvfp4: NVFP4 linears keep their raw form (for engines with their own FP4 kernels).
// split: keep only that rank's slice of every tensor, cut one layer at a time as it is read.
ModelWeights load_model_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const QuantConfig& quant,
                                bool load_mtp, bool keep_nvfp4 = false, const TensorSplit* split = nullptr);

}  // namespace fathom
