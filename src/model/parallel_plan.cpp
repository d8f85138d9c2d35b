#include "model/parallel_plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace fathom {
namespace {

constexpr double kBf16 = 2.0;
constexpr double kNvfp4 = 0.5 + 1.0 / 16.0;  // a 4-bit code, and an e4m3 scale per 16 weights
constexpr double kFp8 = 1.0;                 // an E4M3 code (block scales: 4 bytes per 16,384 weights)
constexpr double kRuntimeReserve = 1.5e9;    // CUDA graphs, cuBLASLt workspaces (as the runner keeps)

std::string gb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f GB", bytes / 1e9);
  return b;
}

}  // namespace

ParallelPlan plan_parallel(const ModelConfig& c, const ParallelOptions& o) {
  const int N = o.tensor_parallel_size;
  FATHOM_CHECK(N >= 1, "--tensor-parallel-size must be at least 1, got ", N);
  FATHOM_CHECK(o.weight_format == "bf16" || o.weight_format == "nvfp4" || o.weight_format == "fp8",
               "--weight-format must be bf16, nvfp4 or fp8, got '", o.weight_format, "'");
  ParallelPlan p;
  p.options = o;
  // The loader's own rules (model/tensor_split.h); counts below are rank 0's when they hold.
  p.problems = tensor_split_problems(c, N, o.expert_parallel);
  const double H = c.hidden_size, d = c.head_dim;
  // nvfp4: the NVFP4 releases (experts NVFP4, other projections BF16); fp8: Qwen's FP8 releases
  // (every projection FP8 but DeltaNet's b and a, the routers and the shared expert's gate).
  const bool fp8 = o.weight_format == "fp8";
  const double expert_bpw = o.weight_format == "nvfp4" ? kNvfp4 : fp8 ? kFp8 : kBf16;
  const double proj_bpw = fp8 ? kFp8 : kBf16;

  // Attention: q heads split; K/V heads split while there are enough, then one a GPU.
  p.q_heads = c.num_attention_heads / N;
  p.kv_heads_replicated = c.num_key_value_heads > 0 && c.num_key_value_heads < N;
  p.kv_heads = c.num_key_value_heads >= N ? c.num_key_value_heads / N : 1;
  const double q_rows = double(c.num_attention_heads) * d * (c.attn_output_gate ? 2 : 1) / N;
  const double attention_layer = (q_rows + 2.0 * p.kv_heads * d) * H * proj_bpw   // q, k, v
                                 + H * c.num_attention_heads * d / N * proj_bpw  // o
                                 + 2 * d * kBf16;                              // q and k norms

  // Gated DeltaNet: value heads split, key heads split or replicated like K/V heads, with their
  // conv channels and state.
  p.linear_key_heads = c.linear_num_key_heads >= N ? c.linear_num_key_heads / N : (c.linear_num_key_heads > 0 ? 1 : 0);
  p.linear_value_heads = c.linear_num_value_heads / N;
  ModelConfig rank = c;  // rank 0's heads, for the sizes ModelConfig derives
  rank.num_key_value_heads = p.kv_heads;
  rank.linear_num_key_heads = p.linear_key_heads;
  rank.linear_num_value_heads = p.linear_value_heads;
  const double dv = c.linear_value_head_dim;
  const double conv_dim = rank.linear_conv_dim();
  const double linear_layer = (conv_dim + p.linear_value_heads * dv) * H * proj_bpw  // qkv, z
                              + 2.0 * p.linear_value_heads * H * kBf16                // b, a
                              + conv_dim * c.linear_conv_kernel_dim * kBf16           // conv1d
                              + H * p.linear_value_heads * dv * proj_bpw              // out
                              + 2.0 * p.linear_value_heads * 4 + dv * kBf16;  // A_log, dt_bias, norm

  // Routed experts: by columns (TP) or whole experts (EP); the shared expert by columns.
  const double routed_all = double(c.num_experts) * 3 * c.moe_intermediate_size * H * expert_bpw;
  p.experts = c.num_experts == 0 ? 0 : o.expert_parallel ? c.num_experts / N : c.num_experts;
  const double routed = routed_all / N;
  const double shared = 3.0 * c.shared_expert_intermediate_size * H * expert_bpw / N + H * kBf16;  // + its gate
  const double router = double(c.num_experts) * H * kBf16;
  const double dense_mlp = 3.0 * c.intermediate_size * H * proj_bpw / N;
  const double norms = 2 * H * kBf16;

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const bool full = c.layer_types.at(size_t(l)) == LayerType::FullAttention;
    (full ? p.attention_bytes : p.linear_attention_bytes) += full ? attention_layer : linear_layer;
    if (c.is_moe_layer(l)) {
      p.routed_expert_bytes += routed;
      p.other_bytes += shared + router;
    } else {
      p.other_bytes += dense_mlp;
    }
    p.other_bytes += norms;
  }
  p.other_bytes += H * kBf16;  // final norm
  // The embedding whole on every GPU (as the CUDA engine keeps it: a lookup needs no collective),
  // lm_head by vocabulary (tied: this GPU's rows of the embedding, no extra bytes).
  const double table = double(c.vocab_size) * H * kBf16;
  p.embedding_bytes = table + (c.tie_word_embeddings ? 0 : table / N);
  // MTP: fc over [embedding | hidden], its norms, one full-attention MoE layer, BF16 (FP8 in
  // Qwen's FP8 releases).
  if (c.mtp_num_hidden_layers > 0) {
    const double mtp_bpw = fp8 ? kFp8 : kBf16;
    const double mtp_moe = c.num_experts > 0 ? double(c.num_experts) * 3 * c.moe_intermediate_size * H * mtp_bpw / N +
                                                   3.0 * c.shared_expert_intermediate_size * H * mtp_bpw / N + router + H * kBf16
                                             : dense_mlp;
    p.mtp_bytes = c.mtp_num_hidden_layers * (2 * H * H * kBf16 / N + 4 * H * kBf16 + attention_layer + mtp_moe + norms);
  }
  p.weight_bytes =
      p.routed_expert_bytes + p.attention_bytes + p.linear_attention_bytes + p.embedding_bytes + p.other_bytes + p.mtp_bytes;

  const int attention_layers = c.num_full_attention_layers() + c.mtp_num_hidden_layers;
  p.kv_bytes_per_token = double(attention_layers) * double(rank.kv_bytes_per_token_per_layer(KvCacheDtype::Bf16));
  p.state_bytes_per_sequence = double(c.num_linear_attention_layers()) *
                               double(rank.linear_recurrent_state_values() + rank.linear_conv_state_values()) * 4;
  p.free_bytes = o.gpu_memory_utilization * o.gpu_memory_bytes - p.weight_bytes - kRuntimeReserve -
                 o.max_num_seqs * p.state_bytes_per_sequence;
  p.kv_tokens = p.kv_bytes_per_token > 0 ? p.free_bytes / p.kv_bytes_per_token : 0;
  return p;
}

std::string describe_parallel_plan(const ModelConfig& c, const ParallelPlan& p) {
  const ParallelOptions& o = p.options;
  std::ostringstream os;
  os << "split over " << o.tensor_parallel_size << " GPU" << (o.tensor_parallel_size > 1 ? "s" : "")
     << " (tensor parallel" << (o.expert_parallel ? ", routed experts by expert" : ", routed experts by columns")
     << "), weights " << o.weight_format << "; per GPU:\n";
  os << "  heads: attention q " << p.q_heads << ", k/v " << p.kv_heads << (p.kv_heads_replicated ? " (replicated)" : "")
     << "; DeltaNet key " << p.linear_key_heads << ", value " << p.linear_value_heads << "; routed experts "
     << p.experts << (o.expert_parallel || c.num_experts == 0 ? "" : " (a 1/N column slice of each)") << "\n";
  os << "  weights " << gb(p.weight_bytes) << " = routed experts " << gb(p.routed_expert_bytes) << " + attention "
     << gb(p.attention_bytes) << " + DeltaNet " << gb(p.linear_attention_bytes) << " + embedding/lm_head "
     << gb(p.embedding_bytes) << " + MTP " << gb(p.mtp_bytes) << " + shared experts, routers, MLPs, norms "
     << gb(p.other_bytes) << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  KV cache %.1f KB a token (%d attention layers x K,V x %d head(s) x %d x 2 B)\n",
                p.kv_bytes_per_token / 1e3, c.num_full_attention_layers() + c.mtp_num_hidden_layers, p.kv_heads,
                c.head_dim);
  os << line;
  std::snprintf(line, sizeof line,
                "  DeltaNet state %.1f MB a sequence (%d layers x (%d value heads x %d x %d + conv) x 4 B)\n",
                p.state_bytes_per_sequence / 1e6, c.num_linear_attention_layers(), p.linear_value_heads,
                c.linear_key_head_dim, c.linear_value_head_dim);
  os << line;
  std::snprintf(line, sizeof line,
                "  at %.0f GB x %.2f: %.1f GB - weights %.1f - runtime 1.5 - %d sequences' state %.1f = %.1f GB for KV",
                o.gpu_memory_bytes / 1e9, o.gpu_memory_utilization, o.gpu_memory_utilization * o.gpu_memory_bytes / 1e9,
                p.weight_bytes / 1e9, o.max_num_seqs, o.max_num_seqs * p.state_bytes_per_sequence / 1e9,
                p.free_bytes / 1e9);
  os << line;
  if (p.free_bytes > 0 && p.kv_bytes_per_token > 0) {
    std::snprintf(line, sizeof line, " -> %.0f tokens (%.0f per sequence)\n", p.kv_tokens,
                  p.kv_tokens / std::max(1, o.max_num_seqs));
    os << line;
  } else {
    os << " -> does not fit\n";
  }
  for (const std::string& problem : p.problems) os << "  problem: " << problem << "\n";
  return os.str();
}

}  // namespace fathom
