// What each GPU holds when a model is split over N GPUs (tensor parallelism, optionally expert
// parallelism for the routed experts), computed from the config alone: weight bytes, KV-cache
// bytes per token and linear-attention state bytes per sequence, and what fits beside them at a
// given memory size. `fathom inspect --tensor-parallel-size N` prints it, so a deployment can be
// sized before any GPU is bought (docs/design.md, "Splitting over GPUs").
//
// The split follows vLLM's: attention q heads and output rows by head; K/V heads by head while
// N <= their count, then replicated (each GPU keeps one); Gated DeltaNet key/value heads, their
// conv channels and states by head; MLPs and the shared expert by the intermediate dimension;
// routed experts by the intermediate dimension (TP) or whole experts per GPU (EP); lm_head by
// vocabulary; the embedding, norms, routers and gates replicated (model/tensor_split.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/tensor_split.h"

namespace fathom {

struct ParallelOptions {
  int tensor_parallel_size = 1;
  bool expert_parallel = false;
  // Weight storage: "bf16", or "nvfp4" as the ModelOpt NVFP4 releases store it (routed and shared
  // experts NVFP4: 4-bit codes plus an e4m3 scale per 16; attention, DeltaNet, routers,
  // embeddings and the MTP layer BF16).
  std::string weight_format = "bf16";
  double gpu_memory_bytes = 141e9;  // per GPU (H200: 141 GB)
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 64;            // sequences whose linear-attention state is held per GPU
};

struct ParallelPlan {
  ParallelOptions options;
  // Per GPU.
  int q_heads = 0, kv_heads = 0, linear_key_heads = 0, linear_value_heads = 0, experts = 0;
  bool kv_heads_replicated = false;
  double weight_bytes = 0, routed_expert_bytes = 0, embedding_bytes = 0, attention_bytes = 0,
         linear_attention_bytes = 0, other_bytes = 0, mtp_bytes = 0;
  double kv_bytes_per_token = 0;            // full-attention layers (and MTP's), bf16 K and V
  double state_bytes_per_sequence = 0;      // fp32 recurrent + conv state of every DeltaNet layer
  // At options.gpu_memory_bytes x utilization, less weights, 1.5 GB of runtime reserve and the
  // states of max_num_seqs sequences: the KV tokens left (negative: does not fit).
  double free_bytes = 0;
  double kv_tokens = 0;
  std::vector<std::string> problems;  // head or expert counts N does not divide
};

ParallelPlan plan_parallel(const ModelConfig& cfg, const ParallelOptions& options);

// A human-readable account of the plan, with its arithmetic.
std::string describe_parallel_plan(const ModelConfig& cfg, const ParallelPlan& plan);

}  // namespace fathom
