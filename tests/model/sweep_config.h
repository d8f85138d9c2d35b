// The shape sweep's model configs (issue 29): Qwen3.5-MoE, Qwen3-Next and dense Qwen3 shapes from
// a space wider than the fixtures, drawn from a seed or from the fixed list every sweep runs.
// random_checkpoint.h writes one as a checkpoint. Drawn models stay tiny (at most
// kSweepMaxParameters weights) so the fp32 CPU engine runs a 130-token prompt through one in well
// under a second; draws use SeededRandom (seeded_random.h), the same on every machine.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fathom::testutil {

enum class SweepArch { Qwen35Moe, Qwen3Next, Qwen3Dense };
enum class SweepQuant {
  Bf16,          // every weight BF16
  Nvfp4Experts,  // routed and shared experts (and Qwen3-Next's dense MLP layers) NVFP4, as the releases
  Nvfp4All,      // every linear NVFP4 except lm_head, routers, shared_expert_gate and mtp.fc
};

const char* sweep_arch_name(SweepArch arch);     // "qwen35_moe", "qwen3_next", "qwen3"
const char* sweep_quant_name(SweepQuant quant);  // "bf16", "nvfp4-experts", "nvfp4-all"

// A drawn model at most this big (weights, MTP layer included).
inline constexpr int64_t kSweepMaxParameters = 4'000'000;

struct SweepConfig {
  uint64_t seed = 0;  // of the weights (and, for draws, of the config)
  SweepArch arch = SweepArch::Qwen35Moe;
  SweepQuant quant = SweepQuant::Bf16;
  bool mtp = false;  // one MTP layer (hybrid archs)

  int hidden = 64;
  int vocab = 256;
  std::string layer_pattern = "LLLF";  // one letter per layer: 'L' Gated DeltaNet, 'F' full attention

  // Full attention.
  int heads = 4, kv_heads = 2, head_dim = 32;
  bool attn_output_gate = true;        // q_proj also produces a sigmoid gate: hybrid archs, always
  double partial_rotary_factor = 0.25;
  double rope_theta = 1e7;

  // Gated DeltaNet (hybrid archs).
  int linear_key_heads = 2, linear_value_heads = 4;
  int linear_key_dim = 32, linear_value_dim = 32;
  int conv_kernel = 4;

  // MoE (hybrid archs): every layer's MLP except Qwen3-Next's mlp_only_layers.
  int experts = 8, top_k = 2;
  int moe_intermediate = 48;
  int shared_intermediate = 48;  // 0: no shared expert
  bool norm_topk_prob = true;    // Qwen3.5-MoE always renormalises

  // Dense MLP: dense Qwen3's layers, Qwen3-Next's mlp_only_layers (its config always carries it).
  int intermediate = 128;
  std::vector<int> mlp_only_layers;  // Qwen3-Next only

  bool tie_word_embeddings = false;

  // For the GPU sweep (tests/cuda/test_cuda_shape_sweep.cpp): prefill every token count of its
  // prompt, not a sample. Set on the named cases.
  bool every_token_count = false;

  int layers() const { return int(layer_pattern.size()); }
  bool moe() const { return arch != SweepArch::Qwen3Dense; }
  bool hybrid() const { return arch != SweepArch::Qwen3Dense; }
  // Weights written for the text model and its MTP layer (the Qwen3.5 vision tower left out).
  int64_t parameters() const;
  // One line with the key dims and the seed, e.g. "qwen35_moe nvfp4-all H96 L4 q6/kv2x32 lin2/4
  // k32 v32 E12k3 I48 S48 mtp LLLF V512 #1000".
  std::string describe() const;
};

// Whether layer `layer` has a dense MLP (Qwen3-Next's mlp_only_layers).
bool is_mlp_only(const SweepConfig& c, int layer);

// Why the engine would refuse this config (or why it would not be a faithful checkpoint); empty
// when it is fine. write_random_checkpoint throws std::invalid_argument with this text.
std::string sweep_config_problem(const SweepConfig& cfg);

// A config drawn from the sweep's space (hidden 64-640, 1-16 heads, head dims 16-256, 3-70 experts,
// top-k 1-10, NVFP4 on experts or everything, MTP on or off ...), deterministic in `seed`.
SweepConfig draw_sweep_config(uint64_t seed);

// The configs every sweep runs: each arch x quantization, the named cases of the issue, and the
// edges of the space (head dims 24/48/80/96/256, top-k 1 and 10, 3 and 70 experts).
std::vector<SweepConfig> fixed_sweep_configs();

}  // namespace fathom::testutil
