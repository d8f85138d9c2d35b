// Per-sequence decoding state: the KV cache of each full-attention layer, the conv window and
// recurrent matrix of each Gated DeltaNet layer, and the MTP layer's own KV cache.
// It is a plain value: copying it checkpoints the sequence (used to roll back speculation).
#pragma once
#include <cstdint>
#include <vector>

namespace fathom {

struct KvCache {
  int n_kv = 0, head_dim = 0;
  std::vector<float> k, v;  // [length, n_kv, head_dim]
  int64_t length() const { return n_kv ? int64_t(k.size()) / (int64_t(n_kv) * head_dim) : 0; }
  void truncate(int64_t len) {
    k.resize(size_t(len) * n_kv * head_dim);
    v.resize(size_t(len) * n_kv * head_dim);
  }
};

struct LinearAttentionState {
  std::vector<float> conv;       // [kernel-1, conv_dim]: the last pre-conv inputs, oldest first
  std::vector<float> recurrent;  // [HV, dk, dv] fp32
};

struct SequenceState {
  int64_t num_tokens = 0;                   // positions consumed by the main model
  std::vector<KvCache> kv;                  // one per full-attention layer, in layer order
  std::vector<LinearAttentionState> linear; // one per linear-attention layer, in layer order
  KvCache mtp_kv;                           // the MTP layer's cache (positions it has consumed)

  // Linear-attention states kept by the last forward that asked for history (draft
  // verification): history[l][i] is layer l's state after the first i tokens of that forward,
  // i = 0 being the state before it. history_base is the length at which that forward began.
  int64_t history_base = -1;
  std::vector<std::vector<LinearAttentionState>> history;
};

}  // namespace fathom
