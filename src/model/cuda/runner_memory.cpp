// The CUDA engine's memory plan: states, step scratch and metadata, sampling buffers, then the
// KV pools from what is left of --gpu-memory-utilization.
#include "model/cuda/kernel_coverage.h"
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

// ---- caches, states and scratch
void CudaRunner::Impl::allocate_runtime() {
  fp.weight_bytes = w.weight_bytes;
  fp.expert_bytes = w.expert_bytes;
  fp.dense_bytes = w.dense_bytes;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (w.layers[i].type == LayerType::FullAttention) w.layers[i].attn_index = n_attn++;
    else w.layers[i].linear_index = n_linear++;
  }
  max_blocks = (opt.max_seq_len + opt.block_size - 1) / opt.block_size;
  if (w.has_mtp) w.mtp_layer.attn_index = n_attn;
  slots = opt.max_seqs + 1;
  pad_slot = opt.max_seqs;
  states.allocate(cfg, n_linear, slots, opt.snapshot_slots);
  fp.state_bytes = states.bytes();
  for (int s = opt.max_seqs - 1; s >= 0; --s) free_slots.push_back(s);
  for (int s = opt.snapshot_slots - 1; s >= 0; --s) snap_free_slots.push_back(s);

  T_max = opt.max_tokens_per_step;
  R_max = opt.max_rows_per_step;
  const int K = std::max(1, cfg.num_experts_per_tok);
  // Packed NVFP4 experts run any step on the device (graph-friendly); bf16 experts past 1,024
  // pairs are grouped on the host.
  bool any_packed = w.has_mtp && w.mtp_layer.packed;
  for (const DevLayer& l : w.layers) any_packed = any_packed || l.packed;
  pair_limit = any_packed ? std::max(1024, T_max * K) : std::max(1024, K);
  act.allocate(cfg, w, tp, StepLimits{T_max, R_max, pair_limit, opt.max_seq_len}, n_linear);
  prefill_tensor_core = opt.kernels.attention_prefill_tensor_core && paged_attention_prefill_covers(cfg.head_dim);
  decode_tensor_core = opt.kernels.attention_decode_tensor_core &&
                       paged_attention_decode_covers(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
  if (w.has_mtp) FATHOM_CUDA_CHECK(cudaMallocHost(&mtp_hidden_host, size_t(T_max) * cfg.hidden_size * 4));
  sampling.allocate(R_max, slots, stream);
  // A fused round of one draft has two rows a sequence (a larger one grows q_drawn at its launch).
  if (opt.reserve_sampled_drafts && w.has_mtp) {
    sampling.reserve_drafts(std::min(R_max, 2 * opt.max_seqs), slots, cfg.vocab_size);
    fp.draft_bytes = int64_t(sampling.q_drawn.bytes() + sampling.q_kept.bytes());
  }
  FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&meta_uploaded, cudaEventDisableTiming));

  const int Smax = opt.max_seqs;
  meta_ints = size_t(T_max) * 4 + 2 * size_t(R_max) + (Smax + 1) + 2 * Smax + size_t(Smax) * max_blocks;
  meta_dev = DeviceBuffer(meta_ints * 4);
  FATHOM_CUDA_CHECK(cudaMallocHost(&meta_host, meta_ints * 4));
  auto carve = [&](int32_t* base, Meta& m) {
    m.ids = base;
    m.pos = m.ids + T_max;
    m.seq_of_token = m.pos + T_max;
    m.slot_mapping = m.seq_of_token + T_max;
    m.rows = m.slot_mapping + T_max;
    m.logit_rows = m.rows + R_max;
    m.seq_start = m.logit_rows + R_max;
    m.state_slot = m.seq_start + Smax + 1;
    m.keep_hist = m.state_slot + Smax;
    m.block_tables = m.keep_hist + Smax;
  };
  carve(meta_dev.as<int32_t>(), dmeta);
  carve(meta_host, hmeta);
  allocate_kv_pools();
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// The KV pools come last: with gpu_memory_utilization they take what the weights, states and
// scratch leave of that share of the device, less a reserve for CUDA graphs and cuBLASLt
// workspaces (made later) and, when drafts will be verified, the state history.
void CudaRunner::Impl::allocate_kv_pools() {
  const int bs = opt.block_size;
  int64_t tokens = opt.kv_cache_tokens;
  if (opt.gpu_memory_utilization > 0) {
    size_t free_b = 0, total_b = 0;
    FATHOM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    constexpr double kReserve = 1.5e9;
    const double used = double(total_b - free_b);
    const double budget = opt.gpu_memory_utilization * double(total_b) - used - kReserve -
                          (opt.reserve_history ? double(history_bytes()) : 0.0);
    FATHOM_CHECK(budget >= double(kv_bytes_per_token()) * bs, "--gpu-memory-utilization ", opt.gpu_memory_utilization,
                 ": no room left for a KV cache (weights, states and buffers take ", used / 1e9, " of ", total_b / 1e9,
                 " GB; reserve ", (kReserve + (opt.reserve_history ? double(history_bytes()) : 0.0)) / 1e9, " GB)");
    tokens = int64_t(budget / double(kv_bytes_per_token()));
  }
  // Prefix snapshots' blocks come out of the same budget, after the sequences' and before
  // pad_block; at most a quarter of it (none: no snapshots), so that prefix caching, on by
  // default, never takes the room sequences need.
  int64_t snap_blocks = opt.snapshot_slots > 0 ? (opt.snapshot_tokens + bs - 1) / bs : 0;
  if (opt.gpu_memory_utilization > 0) {
    snap_blocks = std::min(snap_blocks, tokens / bs / 4);
    tokens -= snap_blocks * bs;
  }
  FATHOM_CHECK(tokens >= bs, "no room for a KV cache beside ", snap_blocks * bs, " tokens of prefix snapshots");
  snap_tokens = snap_blocks * bs;
  const int64_t main_blocks = std::max<int64_t>(1, tokens / bs);
  const int64_t num_blocks = main_blocks + snap_blocks + 1;  // + pad_block
  kv_tokens = main_blocks * bs;
  kv.allocate(n_attn + (w.has_mtp ? 1 : 0), num_blocks, bs, cfg.num_key_value_heads, cfg.head_dim, opt.kv_cache_dtype,
              snap_blocks > 0 ? std::max<int64_t>(max_blocks, snap_blocks) : 0, stream);
  fp.kv_bytes = kv.bytes();
  if (tp.rank == 0)  // one rank speaks for the split model
    std::fprintf(stderr, "fathom: KV cache: %lld tokens (%s, %lld bytes/token, %.2f GB)\n", (long long)kv_tokens,
                 kv_cache_dtype_name(opt.kv_cache_dtype), (long long)kv_bytes_per_token(), double(fp.kv_bytes) / 1e9);
  pad_block = int32_t(num_blocks - 1);
  for (int64_t b2 = main_blocks - 1; b2 >= 0; --b2) free_blocks.push_back(int32_t(b2));
  for (int64_t b2 = main_blocks + snap_blocks - 1; b2 >= main_blocks; --b2) snap_free_blocks.push_back(int32_t(b2));
}

void CudaRunner::Impl::log_generic_kernels() const {
  if (tp.rank > 0) return;  // one rank speaks for the split model
  for (const std::string& n : generic_kernel_notes(cfg, w)) std::fprintf(stderr, "fathom: generic kernel: %s\n", n.c_str());
}

}  // namespace fathom::cuda
