#include "model/tensor_split.h"

#include <algorithm>

#include "core/error.h"

namespace fathom {
namespace {

IndexRange nth(int count, int rank, int size) { return {count / size * rank, count / size * (rank + 1)}; }

// Heads split by rank while there are at least `size` of them; else the one head that rank's
// share of the `users` (q heads of a K/V head, value heads of a key head) reads.
IndexRange split_or_replicate(int heads, int users, int rank, int size) {
  if (heads == 0) return {};
  if (heads >= size) return nth(heads, rank, size);
  const int per_head = users / heads, first_user = users / size * rank;
  return {first_user / per_head, first_user / per_head + 1};
}

void check_divides(std::vector<std::string>& out, int count, int size, const std::string& what) {
  if (count > 0 && count % size != 0)
    out.push_back(what + " (" + std::to_string(count) + ") do not split over " + std::to_string(size) + " ranks");
}

// Fewer heads than ranks: each head is kept by size / heads ranks, which needs heads | size.
void check_replicates(std::vector<std::string>& out, int heads, int size, const std::string& what) {
  if (heads > 0 && heads < size && size % heads != 0)
    out.push_back(what + " (" + std::to_string(heads) + ") do not replicate evenly over " + std::to_string(size) +
                  " ranks");
}

}  // namespace

std::vector<std::string> tensor_split_problems(const ModelConfig& c, int size, bool expert_parallel) {
  std::vector<std::string> p;
  if (size < 1) {
    p.push_back("the tensor-parallel size must be at least 1, got " + std::to_string(size));
    return p;
  }
  check_divides(p, c.num_attention_heads, size, "attention heads");
  if (c.num_key_value_heads >= size) check_divides(p, c.num_key_value_heads, size, "key/value heads");
  check_replicates(p, c.num_key_value_heads, size, "key/value heads");
  check_divides(p, c.linear_num_value_heads, size, "DeltaNet value heads");
  if (c.linear_num_key_heads >= size) check_divides(p, c.linear_num_key_heads, size, "DeltaNet key heads");
  check_replicates(p, c.linear_num_key_heads, size, "DeltaNet key heads");
  check_divides(p, c.intermediate_size, size, "MLP intermediate columns");
  check_divides(p, c.shared_expert_intermediate_size, size, "shared-expert intermediate columns");
  if (c.num_experts > 0) {
    if (expert_parallel) check_divides(p, c.num_experts, size, "routed experts");
    else check_divides(p, c.moe_intermediate_size, size, "expert intermediate columns");
  }
  return p;
}

namespace {
IndexRange scaled(IndexRange r, int by, int offset = 0) { return {offset + r.begin * by, offset + r.end * by}; }
}  // namespace

IndexRange TensorSplit::q_rows(const ModelConfig& c) const {
  return scaled(q_heads, c.head_dim * (c.attn_output_gate ? 2 : 1));
}
IndexRange TensorSplit::kv_rows(const ModelConfig& c) const { return scaled(kv_heads, c.head_dim); }
IndexRange TensorSplit::o_columns(const ModelConfig& c) const { return scaled(q_heads, c.head_dim); }
IndexRange TensorSplit::linear_value_rows(const ModelConfig& c) const {
  return scaled(linear_value_heads, c.linear_value_head_dim);
}

std::vector<IndexRange> TensorSplit::linear_qkv_rows(const ModelConfig& c) const {
  const int dk = c.linear_key_head_dim, key_all = c.linear_num_key_heads * dk;
  return {scaled(linear_key_heads, dk), scaled(linear_key_heads, dk, key_all),
          scaled(linear_value_heads, c.linear_value_head_dim, 2 * key_all)};
}

ModelConfig rank_config(const ModelConfig& cfg, const TensorSplit& s) {
  if (!s.is_split()) return cfg;
  ModelConfig c = cfg;
  c.num_attention_heads = s.q_heads.size();
  c.num_key_value_heads = s.kv_heads.size();
  c.linear_num_key_heads = s.linear_key_heads.size();
  c.linear_num_value_heads = s.linear_value_heads.size();
  c.intermediate_size = s.mlp_columns.size();
  c.shared_expert_intermediate_size = s.shared_columns.size();
  c.moe_intermediate_size = s.expert_columns.size();
  return c;
}

TensorSplit TensorSplit::whole(const ModelConfig& cfg) { return make(cfg, 0, 1, false); }

TensorSplit TensorSplit::make(const ModelConfig& c, int rank, int size, bool expert_parallel) {
  const std::vector<std::string> problems = tensor_split_problems(c, size, expert_parallel);
  if (!problems.empty()) {
    std::string all;
    for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
    fail("--tensor-parallel-size ", size, " does not fit ", c.architecture, ": ", all);
  }
  FATHOM_CHECK(rank >= 0 && rank < size, "rank ", rank, " is outside a group of ", size);
  TensorSplit s;
  s.rank = rank;
  s.size = size;
  s.expert_parallel = expert_parallel && c.num_experts > 0;
  s.q_heads = nth(c.num_attention_heads, rank, size);
  s.kv_heads = split_or_replicate(c.num_key_value_heads, c.num_attention_heads, rank, size);
  s.linear_value_heads = nth(c.linear_num_value_heads, rank, size);
  s.linear_key_heads = split_or_replicate(c.linear_num_key_heads, c.linear_num_value_heads, rank, size);
  s.mlp_columns = nth(c.intermediate_size, rank, size);
  s.shared_columns = nth(c.shared_expert_intermediate_size, rank, size);
  if (s.expert_parallel) {
    s.experts = nth(c.num_experts, rank, size);
    s.expert_columns = {0, c.moe_intermediate_size};
  } else {
    s.experts = {0, c.num_experts};
    s.expert_columns = nth(c.moe_intermediate_size, rank, size);
  }
  s.vocab_rows = (c.vocab_size + size - 1) / size;
  s.vocab = {std::min(c.vocab_size, s.vocab_rows * rank), std::min(c.vocab_size, s.vocab_rows * (rank + 1))};
  return s;
}

}  // namespace fathom
