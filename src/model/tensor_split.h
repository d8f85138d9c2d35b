// Which slice of each tensor one rank of a tensor-parallel group holds (issue 15): the ranges of
// attention heads, Gated DeltaNet heads, MLP columns, routed experts and vocabulary rows, from
// the config, the group size and the rank. The CPU reference, the CUDA engine, the weight
// loader and `fathom inspect` all take their split from here, so they cannot disagree.
//
// The rules follow vLLM's: q heads split; K/V heads split while there are at least N of them,
// else each rank keeps the one its q heads use (replicated); Gated DeltaNet value heads split,
// key heads likewise split or replicated; MLP and shared-expert columns split (gate/up rows,
// down columns); routed experts split by columns (TP) or whole experts per rank (EP);
// embedding and lm_head by vocabulary rows, padded so every rank holds the same count.
// Norms, routers and gates are replicated.
#pragma once
#include <string>
#include <vector>

#include "io/model_config.h"

namespace fathom {

struct IndexRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
  bool contains(int i) const { return i >= begin && i < end; }
};

struct TensorSplit {
  int rank = 0, size = 1;
  bool expert_parallel = false;
  IndexRange q_heads, kv_heads;                    // attention
  IndexRange linear_key_heads, linear_value_heads;  // Gated DeltaNet
  IndexRange mlp_columns;                          // dense MLP intermediate
  IndexRange expert_columns;                       // routed experts' intermediate (all of it with EP)
  IndexRange shared_columns;                       // shared expert's intermediate
  IndexRange experts;                              // routed experts held (all of them without EP)
  IndexRange vocab;                                // embedding / lm_head rows held (end clipped to the vocab)
  int vocab_rows = 0;                              // rows per rank, the same on every rank (vocab padded)
  // The CUDA engine keeps the whole embedding on every rank (a lookup then needs no collective)
  // and splits only lm_head; the CPU reference splits both.
  bool replicate_embedding = false;

  bool is_split() const { return size > 1; }
  // This rank's rows or columns of the stored (whole) projections; cfg is the whole model's.
  IndexRange q_rows(const ModelConfig& cfg) const;     // q_proj: each head's query rows and gate rows
  IndexRange kv_rows(const ModelConfig& cfg) const;    // k_proj, v_proj
  IndexRange o_columns(const ModelConfig& cfg) const;  // o_proj's input
  // DeltaNet in_proj_qkv rows and conv1d channels, [Q | K | V]: this rank's key heads in Q and K,
  // its value heads in V.
  std::vector<IndexRange> linear_qkv_rows(const ModelConfig& cfg) const;
  IndexRange linear_value_rows(const ModelConfig& cfg) const;  // in_proj_z rows, out_proj's input
  // The whole model on one rank.
  static TensorSplit whole(const ModelConfig& cfg);
  // Rank `rank` of `size`; throws naming every count that `size` does not divide.
  static TensorSplit make(const ModelConfig& cfg, int rank, int size, bool expert_parallel);
};

// `cfg` as one rank sees it: its head counts and MLP / expert / shared-expert widths (the
// vocabulary and expert count stay whole). The CUDA engine sizes its buffers and kernels by it.
ModelConfig rank_config(const ModelConfig& cfg, const TensorSplit& split);

// The counts of `cfg` that a group of `size` cannot split (empty: it can).
std::vector<std::string> tensor_split_problems(const ModelConfig& cfg, int size, bool expert_parallel);

}  // namespace fathom
