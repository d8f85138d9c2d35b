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
  const int H = cfg.hidden_size, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
  const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim;
  const int conv_dim = 2 * hk * dk + hv * dv;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    if (w.layers[i].type == LayerType::FullAttention) w.layers[i].attn_index = n_attn++;
    else w.layers[i].linear_index = n_linear++;
  }
  max_blocks = (opt.max_seq_len + opt.block_size - 1) / opt.block_size;
  if (w.has_mtp) w.mtp_layer.attn_index = n_attn;
  slots = opt.max_seqs + 1;
  pad_slot = opt.max_seqs;
  const StateSizes state = state_sizes();
  if (n_linear > 0) {
    conv_state = DeviceBuffer(size_t(n_linear) * slots * state.conv * 4);
    rec_state = DeviceBuffer(size_t(n_linear) * slots * state.rec * 4);
    fp.state_bytes = int64_t(conv_state.bytes() + rec_state.bytes());
  }
  for (int s = opt.max_seqs - 1; s >= 0; --s) free_slots.push_back(s);
  if (opt.snapshot_slots > 0 && n_linear > 0) {  // prefix snapshots' states, apart from the slots
    snap_conv = DeviceBuffer(size_t(n_linear) * opt.snapshot_slots * state.conv * 4);
    snap_rec = DeviceBuffer(size_t(n_linear) * opt.snapshot_slots * state.rec * 4);
    fp.state_bytes += int64_t(snap_conv.bytes() + snap_rec.bytes());
  }
  for (int s = opt.snapshot_slots - 1; s >= 0; --s) snap_free_slots.push_back(s);

  T_max = opt.max_tokens_per_step;
  R_max = opt.max_rows_per_step;
  const int K = std::max(1, cfg.num_experts_per_tok);
  // Packed NVFP4 experts run any step on the device (graph-friendly); bf16 experts past 1,024
  // pairs are grouped on the host.
  bool any_packed = w.has_mtp && w.mtp_layer.packed;
  for (const DevLayer& l : w.layers) any_packed = any_packed || l.packed;
  pair_limit = any_packed ? std::max(1024, T_max * K) : std::max(1024, K);
  auto f32 = [&](int64_t n) { return DeviceBuffer(size_t(std::max<int64_t>(n, 1)) * 4); };
  auto b16 = [&](int64_t n) { return DeviceBuffer(size_t(std::max<int64_t>(n, 1)) * 2); };
  const int64_t T = T_max;
  const int q_rows = nh * d * (cfg.attn_output_gate ? 2 : 1);
  // The widest output of a projection role among the loaded weights (fused matrices may carry
  // padding rows), so that a buffer holds whatever linear() writes into it.
  auto widest = [&](std::initializer_list<DeviceLinear DevLayer::*> roles) {
    int64_t most = 0;
    auto of = [&](const DevLayer& l) {
      for (auto role : roles) most = std::max<int64_t>(most, (l.*role).out);
    };
    for (const DevLayer& l : w.layers) of(l);
    if (w.has_mtp) of(w.mtp_layer);
    return most;
  };
  x = f32(T * H);
  delta = f32(T * H);
  xn = b16(T * H);
  xn32 = f32(T * H);
  // Split-K decode attention: up to kSplitTokens query tokens, one split per 512 keys (max 16).
  split.splits = std::min(16, std::max(1, (opt.max_seq_len + 511) / 512));
  part_m = f32(int64_t(kSplitTokens) * nh * split.splits);
  part_l = f32(int64_t(kSplitTokens) * nh * split.splits);
  part_acc = f32(int64_t(kSplitTokens) * nh * split.splits * d);
  split.part_m = part_m.as<float>();
  split.part_l = part_l.as<float>();
  split.part_acc = part_acc.as<float>();
  q_raw = f32(T * std::max<int64_t>({q_rows + 2 * nkv * d, widest({&DevLayer::attn_qkv, &DevLayer::q})}));
  k_raw = f32(T * nkv * d);
  v_raw = f32(T * nkv * d);
  q = f32(T * nh * d);
  gate = f32(T * nh * d);
  attn_out = b16(T * nh * d);
  mixed = f32(T * std::max<int64_t>({conv_dim + hv * dv + 2 * hv, widest({&DevLayer::gdn_in, &DevLayer::qkv})}));
  zbuf = f32(T * hv * dv);
  bbuf = f32(T * hv);
  abuf = f32(T * hv);
  ubuf = f32(T * conv_dim);
  core = f32(T * hv * dv);
  if (n_linear > 0 && gdn_chunked_supported(dk, dv) && T >= kGdnChunkedMinTokens)
    gdn_scratch = DeviceBuffer(gdn_chunked_scratch_bytes(int(T), kGdnChunkedMinTokens, hk, hv, dk));
  normed = b16(T * std::max(hv * dv, nh * d));
  const int E = std::max(1, cfg.num_experts), I = std::max(1, cfg.moe_intermediate_size);
  router_logits = f32(T * E);
  router_x3 = b16(T * 3 * H);
  topk_ids = DeviceBuffer(size_t(T) * K * 4);
  topk_w = f32(T * K);
  pair_h = b16(int64_t(pair_limit) * I);
  group_buf = DeviceBuffer(size_t(moe_group_scratch_ints(pair_limit, E)) * 4);
  group = moe_group_scratch(group_buf.as<int32_t>(), pair_limit, E);
  pair_out = f32(int64_t(pair_limit) * H);
  const int S = std::max({1, cfg.shared_expert_intermediate_size, cfg.intermediate_size});
  sh_g = f32(T * std::max<int64_t>({padded_rows(2 * S + 1), widest({&DevLayer::s_fused, &DevLayer::s_gate, &DevLayer::m_gate})}));
  sh_u = f32(T * std::max<int64_t>(S, widest({&DevLayer::s_up, &DevLayer::m_up})));
  sh_h = b16(T * S);
  sh_out = f32(T * H);
  sh_gate = f32(T);
  eg_x = b16(T * H);
  eg_g = f32(T * I);
  eg_u = f32(T * I);
  eg_h = b16(T * I);
  eg_o = f32(T * H);
  eg_rows = DeviceBuffer(size_t(T) * K * 4);
  eg_w = f32(T * K);
  // linear() dequantizes NVFP4 weights here for steps past the GEMV sizes: room for the largest
  // NVFP4 projection of any kind (attention, DeltaNet and shared experts may be NVFP4 too).
  int64_t max_fp4 = 0;
  w.for_each_linear([&](const DeviceLinear& dl) {
    if (dl.is_fp4()) max_fp4 = std::max<int64_t>(max_fp4, int64_t(dl.out) * dl.in);
  });
  dequant = b16(max_fp4);
  sel = f32(int64_t(R_max) * H);
  if (w.has_mtp) {
    mtp_hidden = f32(T * H);
    FATHOM_CUDA_CHECK(cudaMallocHost(&mtp_hidden_host, size_t(T) * H * 4));
    mtp_e = b16(T * H);
    mtp_h = b16(T * H);
  }
  hidden_bf = b16(int64_t(R_max) * H);
  logits = f32(int64_t(R_max) * cfg.vocab_size);
  if (tp.is_split()) {
    logits_part = f32(int64_t(R_max) * tp.vocab_rows);
    logits_all = f32(int64_t(R_max) * tp.vocab_rows * tp.size);
  }
  argmax = DeviceBuffer(size_t(R_max) * 4);
  row_params = DeviceBuffer(size_t(R_max) * sizeof(RowSampling));
  row_out = DeviceBuffer(size_t(R_max) * sizeof(RowSample));
  row_top_ids = DeviceBuffer(size_t(R_max) * kMaxTopLogprobs * 4);
  row_top_lp = DeviceBuffer(size_t(R_max) * kMaxTopLogprobs * 4);
  for (int b = 0; b < 2; ++b) {
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_params_host[b], size_t(R_max) * sizeof(RowSampling)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_out_host[b], size_t(R_max) * sizeof(RowSample)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_ids_host[b], size_t(R_max) * kMaxTopLogprobs * 4));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_lp_host[b], size_t(R_max) * kMaxTopLogprobs * 4));
  }
  last_token = DeviceBuffer(size_t(slots) * 4);
  FATHOM_CUDA_CHECK(cudaMemsetAsync(last_token.data(), 0, last_token.bytes(), stream));
  FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&meta_uploaded, cudaEventDisableTiming));
  for (cudaEvent_t& e : chunk_done) FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  const int Smax = opt.max_seqs;
  meta_ints = size_t(T) * 4 + 2 * size_t(R_max) + (Smax + 1) + 2 * Smax + size_t(Smax) * max_blocks;
  meta_dev = DeviceBuffer(meta_ints * 4);
  FATHOM_CUDA_CHECK(cudaMallocHost(&meta_host, meta_ints * 4));
  auto carve = [&](int32_t* base, Meta& m) {
    m.ids = base;
    m.pos = m.ids + T;
    m.seq_of_token = m.pos + T;
    m.slot_mapping = m.seq_of_token + T;
    m.rows = m.slot_mapping + T;
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
  const int nkv = cfg.num_key_value_heads, d = cfg.head_dim;
  for (int i = 0; i < n_attn + (w.has_mtp ? 1 : 0); ++i) {
    k_pool.emplace_back(size_t(num_blocks) * bs * nkv * d * 2);
    v_pool.emplace_back(size_t(num_blocks) * bs * nkv * d * 2);
    // Arbitrary but finite contents: benchmark contexts read blocks nothing wrote.
    fill_random_bf16(k_pool.back().as<bf16_t>(), num_blocks * bs * nkv * d, 0.5f, 77 + i, stream);
    fill_random_bf16(v_pool.back().as<bf16_t>(), num_blocks * bs * nkv * d, 0.5f, 99 + i, stream);
    fp.kv_bytes += int64_t(k_pool.back().bytes() * 2);
  }
  pad_block = int32_t(num_blocks - 1);
  for (int64_t b2 = main_blocks - 1; b2 >= 0; --b2) free_blocks.push_back(int32_t(b2));
  for (int64_t b2 = main_blocks + snap_blocks - 1; b2 >= main_blocks; --b2) snap_free_blocks.push_back(int32_t(b2));
  if (snap_blocks > 0) {
    std::vector<bf16_t*> ptrs;
    for (size_t i = 0; i < k_pool.size(); ++i) ptrs.push_back(k_pool[i].as<bf16_t>()), ptrs.push_back(v_pool[i].as<bf16_t>());
    pool_ptrs = DeviceBuffer::from_host(ptrs);
    copy_idx = DeviceBuffer(size_t(2) * std::max<int64_t>(max_blocks, snap_blocks) * 4);
  }
}

void CudaRunner::Impl::log_generic_kernels() const {
  if (tp.rank > 0) return;  // one rank speaks for the split model
  for (const std::string& n : generic_kernel_notes(cfg, w)) std::fprintf(stderr, "fathom: generic kernel: %s\n", n.c_str());
}

}  // namespace fathom::cuda
