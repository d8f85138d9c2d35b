// The text model of Qwen3 / Qwen3-Next / Qwen3.5(-MoE) on the CPU reference backend:
// embeddings -> N decoder layers (gated full attention or Gated DeltaNet, then MoE or MLP)
// -> final norm -> lm_head, plus the MTP draft layer. One forward call processes a ragged
// batch: several sequences, each with any number of new tokens (prefill chunk or decode).
//
// Tensor parallel: one HybridModel per rank, each with its slice of the weights (TensorSplit)
// and its rank's communicator; every rank runs the same calls on its own SequenceStates (which
// hold its heads only). Partial sums are all-reduced after each attention / DeltaNet output
// projection and each MLP / MoE, embeddings looked up by vocabulary slice and summed, and the
// lm_head's vocabulary slices gathered, so every rank returns the whole logits.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "core/communicator.h"
#include "io/model_config.h"
#include "model/model_weights.h"
#include "model/sequence_state.h"
#include "model/tensor_split.h"

namespace fathom {

class HybridModel {
 public:
  HybridModel(ModelConfig cfg, ModelWeights weights);
  // One rank of a group: `weights` already cut to `split`; `comm` outlives the model.
  HybridModel(ModelConfig cfg, ModelWeights weights, const TensorSplit& split, Communicator* comm);
  // Reads config, quantization and weights from a checkpoint folder.
  static std::unique_ptr<HybridModel> load(const std::filesystem::path& dir, bool with_mtp = true);
  // The same, keeping only rank comm->rank()'s slice of a group of comm->size().
  static std::unique_ptr<HybridModel> load(const std::filesystem::path& dir, bool with_mtp, Communicator& comm,
                                           bool expert_parallel);

  const ModelConfig& config() const { return cfg_; }

  // Rounds activations to bf16 wherever the CUDA engine stores them in bf16 (matrix-product
  // inputs except routers, the KV cache; NVFP4 weights of non-expert layers when a batch is
  // dequantized for cuBLAS). With it the CPU engine reproduces the CUDA engine's arithmetic up to
  // summation order, which lets tests/cuda compare the two tightly.
  void set_bf16_activations(bool on) { bf16_activations_ = on; }
  // W8A8 FP8 layers quantize their inputs as the checkpoint says (the default, what the CUDA
  // engine computes); off, they run weight-only, as transformers does with dequantized weights.
  void set_fp8_activation_quantization(bool on) { fp8_activations_ = on; }
  // An FP8 (E4M3) KV cache, as the CUDA engine's --kv-cache-dtype fp8: every K (V) value of a
  // full-attention layer is kept as e4m3(x / k_scale) * k_scale (v_scale), the layer's scales
  // (AttentionWeights), rounded to nearest even and saturated at +-448 before scaling back; this
  // replaces the bf16 rounding of the cache that set_bf16_activations applies otherwise.
  void set_kv_cache_fp8(bool on) { kv_cache_fp8_ = on; }
  bool kv_cache_fp8() const { return kv_cache_fp8_; }
  bool has_mtp() const { return w_.mtp.has_value(); }
  SequenceState new_sequence() const;

  struct Segment {
    SequenceState* state;
    std::span<const int32_t> tokens;  // new tokens, appended at positions state->num_tokens...
    bool keep_history = false;        // record linear-attention state after every token
  };
  struct Output {
    int64_t rows = 0;
    std::vector<float> logits;  // [rows, vocab]
    std::vector<float> hidden;  // [rows, hidden]: final post-norm hidden (feeds lm_head and MTP)
  };
  // all_rows: one output row per input token; otherwise only each segment's last token.
  Output forward(std::span<const Segment> batch, bool all_rows) const;

  struct MtpSegment {
    SequenceState* state;
    std::span<const float> hidden;         // [n, hidden]: post-norm hidden of the main model (or MTP)
    std::span<const int32_t> next_tokens;  // [n]: token following each hidden's position
  };
  // MTP layer over rows at positions state->mtp_kv.length() ...; returns its logits (predicting
  // two tokens ahead) and its post-norm output (the hidden input of the next chained step).
  Output mtp_forward(std::span<const MtpSegment> batch, bool all_rows) const;

  // Returns a sequence to `new_length` tokens: KV caches are cut, and the linear-attention
  // state is taken from the history of the last keep_history forward. Throws when the length
  // is not reachable.
  void rollback(SequenceState& state, int64_t new_length) const;

 private:
  struct SegmentView {
    int64_t offset, count, pos0;
    KvCache* kv;
    LinearAttentionState* linear;
    std::vector<LinearAttentionState>* history;  // non-null: snapshot after every token
  };
  void decoder_layer(const LayerWeights& lw, std::vector<float>& x, const std::vector<SegmentView>& segs) const;
  void attention(const AttentionWeights& aw, const float* xn, float* out, const std::vector<SegmentView>& segs) const;
  void gated_delta_net(const GatedDeltaNetWeights& gw, const float* xn, float* out,
                       const std::vector<SegmentView>& segs) const;
  void moe(const MoeWeights& mw, const float* xn, const float* xn_router, float* out, int64_t n) const;
  void mlp(const MlpWeights& mw, const float* xn, float* out, int64_t n, bool routed = false) const;
  void linear(const float* x, const LinearWeight& w, float* y, int64_t n, bool routed = false) const;
  void round_activations(float* p, size_t n) const;
  // K or V values as the cache keeps them: e4m3 with `scale` (FP8 cache), else as activations.
  void round_kv(float* p, size_t n, float scale) const;
  // Sums partial results over the group (no-op on one rank).
  void all_reduce(std::vector<float>& v) const;
  // Embedding rows of `tokens` into dst [n, hidden] (each rank looks up its vocabulary slice).
  void embed(std::span<const int32_t> tokens, float* dst) const;
  Output finish(const std::vector<float>& x, const std::vector<float>& final_norm,
                const std::vector<SegmentView>& segs, bool all_rows) const;

  ModelConfig cfg_;
  ModelWeights w_;
  TensorSplit split_;
  Communicator* comm_ = nullptr;
  bool bf16_activations_ = false;
  bool fp8_activations_ = true;
  bool kv_cache_fp8_ = false;
  std::vector<int> attn_slot_, linear_slot_;  // layer index -> index into SequenceState vectors
};

}  // namespace fathom
