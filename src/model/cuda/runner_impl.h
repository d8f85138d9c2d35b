// The CUDA engine's state and step machinery (CudaRunner::Impl): caches and buffers, step
// plans and metadata, the layers, CUDA graphs. Shared by the files that implement CudaRunner's
// methods (cuda_runner.cpp: sequences and forward passes; runner_sampling.cpp: device sampling).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/device_weights.h"

namespace fathom::cuda {
namespace runner_detail {

struct Sequence {
  int64_t length = 0;
  int slot = -1;
  std::vector<int32_t> blocks;
  int64_t hist_base = -1, hist_len = 0;  // the last keep_history step: start and token count
  int64_t mtp_length = 0;                // positions the MTP layer has consumed
};

// Per-step metadata, mirrored in pinned host memory and uploaded in one copy.
struct Meta {
  // rows: the tokens whose hidden states are output; logit_rows: indices into rows that get logits.
  int32_t *ids, *pos, *seq_of_token, *slot_mapping, *rows, *logit_rows, *seq_start, *state_slot, *keep_hist,
      *block_tables;
};

}  // namespace runner_detail

struct CudaRunner::Impl {
  using Sequence = runner_detail::Sequence;
  using Meta = runner_detail::Meta;

  ModelConfig cfg;
  CudaRunnerOptions opt;
  cudaStream_t stream = nullptr;
  DeviceWeights w;
  Footprint fp;
  int n_attn = 0, n_linear = 0;

  std::vector<DeviceBuffer> k_pool, v_pool;
  std::vector<int32_t> free_blocks;
  DeviceBuffer conv_state, rec_state;
  DeviceBuffer gdn_scratch;  // gdn_chunked's per-chunk products (prefill steps)
  std::vector<int> free_slots;
  // State slots: max_seqs for sequences and one (pad_slot) for the rows that pad decode batches
  // to a captured graph's size; their KV goes to a reserved block (pad_block).
  int slots = 0, pad_slot = 0;
  int32_t pad_block = 0;
  std::map<SequenceId, Sequence> seqs;
  SequenceId next_id = 1;
  int max_blocks = 0;
  int64_t kv_tokens = 0;  // the KV pools' capacity

  // scratch
  int T_max = 0, R_max = 0, pair_limit = 0;
  static constexpr int kSplitTokens = 64;
  DeviceBuffer xn32, part_m, part_l, part_acc, group_buf;
  MoeGroupScratch group;
  AttentionSplit split;
  DeviceBuffer x, delta, xn, q_raw, k_raw, v_raw, q, gate, attn_out, mixed, zbuf, bbuf, abuf, ubuf, core, normed,
      router_logits, router_x3, topk_ids, topk_w, pair_h, pair_out, sh_g, sh_u, sh_h, sh_out, sh_gate, eg_x, eg_g, eg_u, eg_h,
      eg_o, eg_rows, eg_w, dequant, sel, hidden_bf, logits, argmax;
  DeviceBuffer meta_dev;
  int32_t* meta_host = nullptr;
  size_t meta_ints = 0;
  Meta dmeta{}, hmeta{};

  // MTP draft layer (optional, in w): its own full-attention layer and KV pool (index n_attn).
  DeviceBuffer mtp_hidden, mtp_e, mtp_h;
  // Linear-attention state history for keep_history steps, allocated on first use.
  DeviceBuffer conv_hist, rec_hist;
  StateHistory hist;
  bool hist_step = false;  // the current forward records history

  // Kernel shapes depend on tokens, sequences and output rows; verify steps also pass the state
  // history to the DeltaNet kernels.
  using GraphKey = std::tuple<int, int, int, bool>;
  std::map<GraphKey, cudaGraphExec_t> graphs;
  OpProfile prof;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> pending_events;

  // Device sampling (runner_sampling.cpp): each logits row's parameters and result, mirrored in
  // pinned host memory; the adjustment list grows on demand.
  DeviceBuffer row_params, row_out, row_top_ids, row_top_lp, adjust_dev;
  RowSampling* row_params_host = nullptr;
  RowSample* row_out_host = nullptr;
  int32_t* row_top_ids_host = nullptr;
  float* row_top_lp_host = nullptr;
  LogitAdjustment* adjust_host = nullptr;
  size_t adjust_cap = 0;

  // Decode steps run the shared expert on a second stream, beside the router and the routed
  // experts (independent until the combine): at batch 1 each is too small to fill the GPU.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;

  void init_device() {
    int count = 0;
    FATHOM_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "--device cuda: no CUDA device is visible");
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
  }

  ~Impl() {
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    for (auto& p : pending_events) cudaEventDestroy(p.second.first), cudaEventDestroy(p.second.second);
    if (meta_host) cudaFreeHost(meta_host);
    for (void* p : {(void*)row_params_host, (void*)row_out_host, (void*)row_top_ids_host, (void*)row_top_lp_host,
                    (void*)adjust_host})
      if (p) cudaFreeHost(p);
    if (fork_event) cudaEventDestroy(fork_event);
    if (join_event) cudaEventDestroy(join_event);
    if (side_stream) cudaStreamDestroy(side_stream);
    if (stream) cudaStreamDestroy(stream);
  }

  // ---- caches, states and scratch
  void allocate_runtime() {
    fp.weight_bytes = w.weight_bytes;
    fp.expert_bytes = w.expert_bytes;
    fp.dense_bytes = w.dense_bytes;
    const int H = cfg.hidden_size, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
    const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
    const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
    const int conv_dim = 2 * hk * dk + hv * dv;
    for (size_t i = 0; i < w.layers.size(); ++i) {
      if (w.layers[i].type == LayerType::FullAttention) w.layers[i].attn_index = n_attn++;
      else w.layers[i].linear_index = n_linear++;
    }
    max_blocks = (opt.max_seq_len + opt.block_size - 1) / opt.block_size;
    if (w.has_mtp) w.mtp_layer.attn_index = n_attn;
    slots = opt.max_seqs + 1;
    pad_slot = opt.max_seqs;
    if (n_linear > 0) {
      conv_state = DeviceBuffer(size_t(n_linear) * slots * (kc - 1) * conv_dim * 4);
      rec_state = DeviceBuffer(size_t(n_linear) * slots * hv * dk * dv * 4);
      fp.state_bytes = int64_t(conv_state.bytes() + rec_state.bytes());
    }
    for (int s = opt.max_seqs - 1; s >= 0; --s) free_slots.push_back(s);

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
    q_raw = f32(T * (q_rows + 2 * nkv * d));  // room for the fused [q | k | v] output
    k_raw = f32(T * nkv * d);
    v_raw = f32(T * nkv * d);
    q = f32(T * nh * d);
    gate = f32(T * nh * d);
    attn_out = b16(T * nh * d);
    mixed = f32(T * (conv_dim + hv * dv + 2 * hv));  // room for the fused [qkv | z | b | a] output
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
    sh_g = f32(T * padded_rows(2 * S + 1));  // room for the fused [gate | up | gate logit] output
    sh_u = f32(T * S);
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
    int64_t max_fp4 = 1;
    for (const DevLayer& l : w.layers)
      for (const auto* v2 : {&l.ex_gate, &l.ex_up, &l.ex_down})
        for (const DeviceLinear& dl : *v2) max_fp4 = std::max<int64_t>(max_fp4, int64_t(dl.out) * dl.in);
    dequant = b16(std::max<int64_t>(max_fp4, int64_t(S) * H));
    sel = f32(int64_t(R_max) * H);
    if (w.has_mtp) {
      mtp_hidden = f32(T * H);
      mtp_e = b16(T * H);
      mtp_h = b16(T * H);
    }
    hidden_bf = b16(int64_t(R_max) * H);
    logits = f32(int64_t(R_max) * cfg.vocab_size);
    argmax = DeviceBuffer(size_t(R_max) * 4);
    row_params = DeviceBuffer(size_t(R_max) * sizeof(RowSampling));
    row_out = DeviceBuffer(size_t(R_max) * sizeof(RowSample));
    row_top_ids = DeviceBuffer(size_t(R_max) * kMaxTopLogprobs * 4);
    row_top_lp = DeviceBuffer(size_t(R_max) * kMaxTopLogprobs * 4);
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_params_host, size_t(R_max) * sizeof(RowSampling)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_out_host, size_t(R_max) * sizeof(RowSample)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_ids_host, size_t(R_max) * kMaxTopLogprobs * 4));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_lp_host, size_t(R_max) * kMaxTopLogprobs * 4));

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

  int64_t kv_bytes_per_token() const {
    return int64_t(n_attn + (w.has_mtp ? 1 : 0)) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2;
  }
  int64_t history_bytes() const {
    const int64_t conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim +
                             cfg.linear_num_value_heads * cfg.linear_value_head_dim;
    const int64_t per_entry = (cfg.linear_conv_kernel_dim - 1) * conv_dim +
                              int64_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim;
    return int64_t(n_linear) * slots * (opt.max_history + 1) * per_entry * 4;
  }

  // The KV pools come last: with gpu_memory_utilization they take what the weights, states and
  // scratch leave of that share of the device, less a reserve for CUDA graphs and cuBLASLt
  // workspaces (made later) and, when drafts will be verified, the state history.
  void allocate_kv_pools() {
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
    const int64_t num_blocks = std::max<int64_t>(1, tokens / bs) + 1;  // + pad_block
    kv_tokens = (num_blocks - 1) * bs;
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
    for (int64_t b2 = num_blocks - 2; b2 >= 0; --b2) free_blocks.push_back(int32_t(b2));
  }

  // ---- profiling
  struct Scope {
    Impl* impl;
    std::string name;
    cudaEvent_t a = nullptr, b = nullptr;
    Scope(Impl* i, const char* n) : impl(i), name(n) {
      if (!impl->opt.profile) return;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      cudaEventRecord(a, impl->stream);
    }
    ~Scope() {
      if (!impl->opt.profile) return;
      cudaEventRecord(b, impl->stream);
      impl->pending_events.push_back({name, {a, b}});
    }
  };
  void collect_profile() {
    if (pending_events.empty()) return;
    cudaStreamSynchronize(stream);
    for (auto& [name, ev] : pending_events) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev.first, ev.second);
      prof.ms[name] += ms;
      prof.calls[name] += 1;
      cudaEventDestroy(ev.first);
      cudaEventDestroy(ev.second);
    }
    pending_events.clear();
  }

  // ---- one forward over a batch that fits the scratch buffers
  // Attention over runs of consecutive sequences: runs whose sequences have at least
  // kPrefillRunTokens tokens each go to the prefill kernel, the others to the decode kernel.
  static constexpr int kPrefillRunTokens = 16;
  struct AttentionRun {
    int t0 = 0, n = 0;  // tokens [t0, t0 + n) of the step
    bool prefill = false;
  };
  struct Plan {
    int T = 0, S = 0, R = 0, RL = 0;  // tokens, sequences, hidden rows, logits rows
    std::vector<int64_t> row_begin, logit_row_begin;  // per sequence
    int max_seq_tokens = 0;                           // the most tokens of one sequence
    std::vector<AttentionRun> attention_runs;
    // Only decode steps (one token) and draft verification steps (keep_history, all rows): the
    // shapes a CUDA graph keyed by (T, S, R, history) can replay.
    bool graphable = true;
    int pad = 0;  // padding rows at the end (a decode batch raised to a graph bucket)
  };

  // Appends sequence i of a batch to the step metadata: its tokens at positions start.. (blocks
  // grown as needed), the output rows (hidden states of every token with all_rows or all_hidden,
  // logits of every token with all_rows; else the last token's), its state slot and block table.
  // A sequence too long or holding a token outside the vocabulary fails alone (SequenceError).
  // forward() checks every step before it runs any chunk of the batch, so no state has changed.
  void check_step(SequenceId id, int64_t start, std::span<const int32_t> tokens) const {
    const int64_t n = int64_t(tokens.size());
    if (start + n > opt.max_seq_len)
      throw SequenceError(id, "sequence of " + std::to_string(start + n) + " tokens exceeds the engine's max_seq_len " +
                                  std::to_string(opt.max_seq_len));
    for (int32_t t : tokens)
      if (t < 0 || t >= cfg.vocab_size)
        throw SequenceError(id, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                    std::to_string(cfg.vocab_size) + ")");
  }

  void add_to_plan(Plan& p, int i, SequenceId id, Sequence& sq, int64_t start, std::span<const int32_t> tokens,
                   bool all_rows, bool all_hidden = false) {
    const int n = int(tokens.size());
    const int bs = opt.block_size;
    check_step(id, start, tokens);
    while (int64_t(sq.blocks.size()) * bs < start + n) {
      FATHOM_CHECK(!free_blocks.empty(), "KV cache is full (", kv_tokens, " tokens)");
      sq.blocks.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    for (int j = 0; j < n; ++j) {
      const int t = p.T + j;
      const int64_t posn = start + j;
      hmeta.ids[t] = tokens[j];
      hmeta.pos[t] = int32_t(posn);
      hmeta.seq_of_token[t] = i;
      hmeta.slot_mapping[t] = sq.blocks[posn / bs] * bs + int32_t(posn % bs);
    }
    p.row_begin.push_back(p.R);
    p.logit_row_begin.push_back(p.RL);
    if (all_rows || all_hidden) {
      for (int j = 0; j < n; ++j) hmeta.rows[p.R++] = p.T + j;
    } else {
      hmeta.rows[p.R++] = p.T + n - 1;
    }
    if (all_rows) {
      for (int j = n; j > 0; --j) hmeta.logit_rows[p.RL++] = p.R - j;
    } else {
      hmeta.logit_rows[p.RL++] = p.R - 1;
    }
    const bool prefill = n >= kPrefillRunTokens;
    if (p.attention_runs.empty() || p.attention_runs.back().prefill != prefill)
      p.attention_runs.push_back({p.T, 0, prefill});
    p.attention_runs.back().n += n;
    p.max_seq_tokens = std::max(p.max_seq_tokens, n);
    p.T += n;
    hmeta.seq_start[i + 1] = p.T;
    hmeta.state_slot[i] = sq.slot;
    std::fill(hmeta.block_tables + int64_t(i) * max_blocks, hmeta.block_tables + int64_t(i + 1) * max_blocks, 0);
    std::copy(sq.blocks.begin(), sq.blocks.end(), hmeta.block_tables + int64_t(i) * max_blocks);
  }

  Plan prepare(std::span<const ForwardStep> steps) {
    Plan p;
    bool decode_only = true;
    p.S = int(steps.size());
    FATHOM_CHECK(p.S <= opt.max_seqs, "batch of ", p.S, " sequences exceeds max_seqs ", opt.max_seqs);
    hmeta.seq_start[0] = 0;
    hist_step = false;
    for (int i = 0; i < p.S; ++i) {
      const ForwardStep& st = steps[i];
      Sequence& sq = seq(st.seq);
      const int n = int(st.tokens.size());
      FATHOM_CHECK(n > 0, "forward: a step has no tokens");
      hmeta.keep_hist[i] = st.keep_history ? 1 : 0;
      if (st.keep_history) {
        FATHOM_CHECK(n <= opt.max_history, "a keep_history step of ", n, " tokens exceeds max_history ",
                     opt.max_history);
        if (n_linear > 0) ensure_history();
        hist_step = true;
        sq.hist_base = sq.length;
        sq.hist_len = n;
      }
      if (n != 1 && !(st.keep_history && st.all_rows && !st.all_hidden)) p.graphable = false;
      if (n != 1 || st.keep_history) decode_only = false;
      add_to_plan(p, i, st.seq, sq, sq.length, st.tokens, st.all_rows, st.all_hidden);
    }
    if (decode_only && uses_graphs()) {
      const int B = graph_bucket(p.S);
      if (fits_graph(B)) pad_to(p, B);
    }
    upload_meta(p.S);
    return p;
  }

  bool uses_graphs() const { return opt.cuda_graphs && !opt.profile; }

  // Decode batch sizes that get a CUDA graph: a plain decode step of S sequences is padded to the
  // smallest bucket >= S, so a few graphs, captured at start-up, serve every batch size.
  std::vector<int> graph_buckets() const {
    std::vector<int> b;
    for (int s : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256})
      if (s < opt.max_seqs) b.push_back(s);
    for (int s = 320; s < opt.max_seqs; s += 64) b.push_back(s);
    b.push_back(opt.max_seqs);
    return b;
  }
  int graph_bucket(int S) const {
    for (int b : graph_buckets())
      if (b >= S) return b;
    return S;
  }

  bool fits_graph(int B) const {
    return B <= T_max && B <= R_max && B * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
  }
  // A decode step of B padding rows only (what start-up captures), its metadata uploaded.
  Plan padding_plan(int B) {
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the previous step's metadata copy has left meta_host
    Plan p;
    hmeta.seq_start[0] = 0;
    hist_step = false;
    p.attention_runs.push_back({0, 0, false});
    p.max_seq_tokens = 1;
    pad_to(p, B);
    upload_meta(p.S);
    return p;
  }

  // Rows S.. of a decode batch up to B: token 0 at position 0 of a scratch sequence (pad_slot's
  // state, pad_block's KV), whose outputs nobody reads.
  void pad_to(Plan& p, int B) {
    for (int i = p.S; i < B; ++i) {
      const int t = p.T;
      hmeta.ids[t] = 0;
      hmeta.pos[t] = 0;
      hmeta.seq_of_token[t] = i;
      hmeta.slot_mapping[t] = pad_block * opt.block_size;
      p.row_begin.push_back(p.R);
      p.logit_row_begin.push_back(p.RL);
      hmeta.rows[p.R++] = t;
      hmeta.logit_rows[p.RL++] = p.R - 1;
      p.attention_runs.back().n += 1;  // decode rows, like the batch's own
      p.T += 1;
      hmeta.seq_start[i + 1] = p.T;
      hmeta.state_slot[i] = pad_slot;
      hmeta.keep_hist[i] = 0;
      hmeta.block_tables[int64_t(i) * max_blocks] = pad_block;
    }
    p.pad = B - p.S;
    p.S = B;
  }

  void start_up_graphs() {
    if (!opt.capture_graphs_at_start || !uses_graphs()) return;
    std::fprintf(stderr, "fathom: capturing CUDA graphs for decode batches of up to %d sequences ...\n", opt.max_seqs);
    const auto t0 = std::chrono::steady_clock::now();
    const auto [n, bytes] = capture_decode_graphs();
    std::fprintf(stderr, "fathom: captured %d decode graphs in %.2f s, %.1f MB of device memory (graphs and workspaces)\n", n,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), double(bytes) / 1e6);
  }

  // Captures the graphs of every decode bucket (a step of padding rows only), so that serving
  // never stops to capture. Returns the buckets and the device memory the graphs took.
  std::pair<int, int64_t> capture_decode_graphs() {
    if (!uses_graphs()) return {0, 0};
    size_t free0 = 0, free1 = 0, total = 0;
    FATHOM_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    const std::vector<int> buckets = graph_buckets();
    // One uncaptured step first: lazily made resources (GEMM workspaces, kernel attributes)
    // cannot be made while a stream is capturing.
    for (int B : {buckets.front(), buckets.back()}) {
      if (!fits_graph(B)) continue;
      const Plan p = padding_plan(B);
      set_programmatic_launch(p.T <= kSplitTokens);
      run_layers(p);
      head(p);
    }
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int B : buckets)
      if (fits_graph(B)) run(padding_plan(B));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    FATHOM_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    return {int(buckets.size()), int64_t(free0) - int64_t(free1)};
  }

  // The step's metadata to the device: the block tables come last, so only the rows of the
  // step's S sequences travel (each row is max_seq_len / block_size wide, 16,384 entries at
  // 262,144 tokens).
  void upload_meta(int S) {
    const size_t ints = meta_ints - size_t(opt.max_seqs - S) * size_t(max_blocks);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(meta_dev.data(), meta_host, ints * 4, cudaMemcpyHostToDevice, stream));
  }

  void ensure_history() {
    if (hist.conv) return;
    const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
    const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
    const int64_t per_slot = int64_t(opt.max_history + 1);
    conv_hist = DeviceBuffer(size_t(n_linear) * slots * per_slot * (kc - 1) * (2 * hk * dk + hv * dv) * 4);
    rec_hist = DeviceBuffer(size_t(n_linear) * slots * per_slot * hv * dk * dv * 4);
    hist.conv = conv_hist.as<float>();
    hist.recurrent = rec_hist.as<float>();
    hist.entries = opt.max_history + 1;
  }

  // Per-layer view of the history pools ([layer][slot][entry]...).
  StateHistory layer_history(int linear_index) const {
    const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
    const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
    const int64_t per_layer = int64_t(slots) * hist.entries;
    StateHistory h = hist;
    h.conv += linear_index * per_layer * (kc - 1) * (2 * hk * dk + hv * dv);
    h.recurrent += linear_index * per_layer * hv * dk * dv;
    h.keep = dmeta.keep_hist;
    return h;
  }

  void commit(std::span<const ForwardStep> steps) {
    for (const ForwardStep& st : steps) seq(st.seq).length += int64_t(st.tokens.size());
  }

  Sequence& seq(SequenceId id) {
    auto it = seqs.find(id);
    FATHOM_CHECK(it != seqs.end(), "unknown sequence id ", id);
    return it->second;
  }

  // One decoder layer on the residual stream x: input norm (fused with adding the previous
  // layer's output `delta`, unless `first`), the mixer, post norm, the MLP or MoE; the layer's
  // output is left in `delta`. Used by the main layers and the MTP layer alike.
  void decoder_layer(const DevLayer& l, const Plan& p, bool first) {
    const cudaStream_t s = stream;
    const int H = cfg.hidden_size, T = p.T;
    const float eps = float(cfg.rms_norm_eps);
    const bool zc = cfg.norm_zero_centered;
    float* X = x.as<float>();
    float* D = delta.as<float>();
    bf16_t* XN = xn.as<bf16_t>();
    {
      Scope sc(this, "norm");
      if (first) rms_norm(X, l.input_norm, XN, nullptr, T, H, eps, zc, s);
      else add_rms_norm(X, D, l.input_norm, XN, T, H, eps, zc, s);
    }
    if (l.type == LayerType::FullAttention) attention_block(l, p);
    else gdn_block(l, p);
    {
      Scope sc(this, "norm");
      // The router's input: fp32 for decode and verify steps, already split for its bf16 product
      // in prefill-sized ones.
      const bool split = l.is_moe && router_split(l, T);
      add_rms_norm(X, D, l.post_norm, XN, T, H, eps, zc, s, l.is_moe && !split ? xn32.as<float>() : nullptr,
                   split ? router_x3.as<bf16_t>() : nullptr);
    }
    if (l.is_moe) moe_block(l, p);
    else mlp_block(l.m_gate, l.m_up, l.m_down, XN, D, T);
  }

  void run_layers(const Plan& p) {
    const cudaStream_t s = stream;
    const int H = cfg.hidden_size, T = p.T;
    float* X = x.as<float>();
    float* D = delta.as<float>();
    {
      Scope sc(this, "embedding");
      embedding(dmeta.ids, w.embed, X, T, H, s);
    }
    for (size_t li = 0; li < w.layers.size(); ++li) decoder_layer(w.layers[li], p, /*first=*/li == 0);
    Scope sc(this, "norm");
    add_inplace(X, D, int64_t(T) * H, s);
  }

  void attention_block(const DevLayer& l, const Plan& p) {
    const cudaStream_t s = stream;
    const int T = p.T, d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
    bf16_t* dq = dequant.as<bf16_t>();
    const float *qp = q_raw.as<float>(), *kp = k_raw.as<float>(), *vp = v_raw.as<float>();
    int64_t qkv_ld = 0;
    {
      Scope sc(this, "attn.proj");
      if (l.attn_qkv.out > 0) {
        linear(l.attn_qkv, xn.as<bf16_t>(), q_raw.as<float>(), T, dq, s);
        qkv_ld = l.attn_qkv.out;
        kp = qp + (qkv_ld - 2 * nkv * d);
        vp = kp + nkv * d;
      } else {
        linear(l.q, xn.as<bf16_t>(), q_raw.as<float>(), T, dq, s);
        linear(l.k, xn.as<bf16_t>(), k_raw.as<float>(), T, dq, s);
        linear(l.v, xn.as<bf16_t>(), v_raw.as<float>(), T, dq, s);
      }
    }
    {
      Scope sc(this, "attn.core");
      attention_prepare(qp, kp, vp, l.q_norm, l.k_norm, dmeta.pos, dmeta.slot_mapping, q.as<float>(),
                        gate.as<float>(), k_pool[l.attn_index].as<bf16_t>(), v_pool[l.attn_index].as<bf16_t>(), T,
                        nh, nkv, d, cfg.rotary_dim(), float(cfg.rope_theta), float(cfg.rms_norm_eps),
                        cfg.attn_output_gate, cfg.norm_zero_centered, s, qkv_ld);
      attend(l, p);
    }
    Scope sc(this, "attn.proj");
    linear(l.o, attn_out.as<bf16_t>(), delta.as<float>(), T, dq, s);
  }

  // Attention over the paged cache, by the plan's runs: prefill runs on the tensor-core prefill
  // kernel, decode and verify tokens on the tensor-core split-K decode kernel, kSplitTokens tokens
  // at a time; the CUDA-core kernels take head sizes those do not cover. Steps holding a prefill
  // chunk are never graph-captured, so deciding on the host is safe.
  void attend(const DevLayer& l, const Plan& p) {
    const cudaStream_t s = stream;
    const int d = cfg.head_dim, nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
    const float* g = cfg.attn_output_gate ? gate.as<float>() : nullptr;
    const bf16_t *kc = k_pool[l.attn_index].as<bf16_t>(), *vc = v_pool[l.attn_index].as<bf16_t>();
    auto run_of = [&](int t0, int n, bool prefill) {
      const int64_t o = int64_t(t0) * nh * d;
      const float* gt = g ? g + o : nullptr;
      if (prefill && paged_attention_prefill(q.as<float>() + o, gt, kc, vc, dmeta.pos + t0, dmeta.seq_of_token + t0,
                                             dmeta.block_tables, max_blocks, opt.block_size,
                                             attn_out.as<bf16_t>() + o, n, nh, nkv, d, s))
        return;
      for (int c = 0; c < n; c += kSplitTokens) {
        const int64_t oc = o + int64_t(c) * nh * d;
        const int m = std::min(kSplitTokens, n - c);
        const float* gc = g ? g + oc : nullptr;
        if (!paged_attention_decode(q.as<float>() + oc, gc, kc, vc, dmeta.pos + t0 + c, dmeta.seq_of_token + t0 + c,
                                    dmeta.block_tables, max_blocks, opt.block_size, attn_out.as<bf16_t>() + oc, m, nh,
                                    nkv, d, s, split))
          paged_attention(q.as<float>() + oc, gc, kc, vc, dmeta.pos + t0 + c, dmeta.seq_of_token + t0 + c,
                          dmeta.block_tables, max_blocks, opt.block_size, attn_out.as<bf16_t>() + oc, m, nh, nkv, d,
                          s, &split);
      }
    };
    for (const AttentionRun& r : p.attention_runs) run_of(r.t0, r.n, r.prefill);
  }

  void gdn_block(const DevLayer& l, const Plan& p) {
    const cudaStream_t s = stream;
    const int T = p.T;
    const int hk = cfg.linear_num_key_heads, hv = cfg.linear_num_value_heads;
    const int dk = cfg.linear_key_head_dim, dv = cfg.linear_value_head_dim, kc = cfg.linear_conv_kernel_dim;
    const int conv_dim = 2 * hk * dk + hv * dv;
    bf16_t* dq = dequant.as<bf16_t>();
    // Projections: one fused GEMM ([qkv | z | b | a] per row) or four.
    const float *mix_p, *z_p, *b_p, *a_p;
    int64_t mix_ld, z_ld, ba_ld;
    {
      Scope sc(this, "gdn.proj");
      if (l.gdn_in.out > 0) {
        const int64_t W = l.gdn_in.out;
        linear(l.gdn_in, xn.as<bf16_t>(), mixed.as<float>(), T, dq, s);
        mix_p = mixed.as<float>();
        z_p = mix_p + conv_dim;
        b_p = z_p + int64_t(hv) * dv;
        a_p = b_p + hv;
        mix_ld = z_ld = ba_ld = W;
      } else {
        linear(l.qkv, xn.as<bf16_t>(), mixed.as<float>(), T, dq, s);
        linear(l.z, xn.as<bf16_t>(), zbuf.as<float>(), T, dq, s);
        linear(l.b, xn.as<bf16_t>(), bbuf.as<float>(), T, dq, s);
        linear(l.a, xn.as<bf16_t>(), abuf.as<float>(), T, dq, s);
        mix_p = mixed.as<float>();
        z_p = zbuf.as<float>();
        b_p = bbuf.as<float>();
        a_p = abuf.as<float>();
        mix_ld = conv_dim;
        z_ld = int64_t(hv) * dv;
        ba_ld = hv;
      }
    }
    {
      float* cs = conv_state.as<float>() + int64_t(l.linear_index) * slots * (kc - 1) * conv_dim;
      float* rs = rec_state.as<float>() + int64_t(l.linear_index) * slots * hv * dk * dv;
      const StateHistory h = hist_step ? layer_history(l.linear_index) : StateHistory{};
      {
        Scope sc(this, "gdn.conv");
        gdn_conv(mix_p, mix_ld, l.conv_w, cs, dmeta.seq_start, dmeta.state_slot, ubuf.as<float>(), p.S, conv_dim, kc,
                 s, hist_step ? &h : nullptr, p.max_seq_tokens);
      }
      {
        // Prefill-sized sequences take the chunked form; the others (decode, verify) the
        // recurrent one, whose bits do not depend on the step's other sequences.
        const bool chunked = !hist_step && p.max_seq_tokens >= kGdnChunkedMinTokens && gdn_scratch.bytes() > 0;
        const int long_from = chunked ? kGdnChunkedMinTokens : 0;
        Scope sc(this, "gdn.recurrent");
        gdn_recurrent(ubuf.as<float>(), b_p, a_p, ba_ld, l.a_log, l.dt_bias, rs, dmeta.seq_start, dmeta.state_slot,
                      core.as<float>(), p.S, hk, hv, dk, dv, s, hist_step ? &h : nullptr, long_from);
        if (long_from > 0)
          gdn_chunked(ubuf.as<float>(), b_p, a_p, ba_ld, l.a_log, l.dt_bias, rs, dmeta.seq_start, dmeta.state_slot,
                      core.as<float>(), p.S, hk, hv, dk, dv, long_from, T, p.max_seq_tokens,
                      {gdn_scratch.data(), gdn_scratch.bytes()}, s);
      }
      Scope sc(this, "gdn.norm");
      gated_rms_norm(core.as<float>(), z_p, z_ld, hv, l.gnorm, normed.as<bf16_t>(), T * hv, dv,
                     float(cfg.rms_norm_eps), s);
    }
    Scope sc(this, "gdn.proj");
    linear(l.out, normed.as<bf16_t>(), delta.as<float>(), T, dq, s);
  }

  void mlp_block(const DeviceLinear& g, const DeviceLinear& u, const DeviceLinear& dn, const bf16_t* in, float* out,
                 int T) {
    const cudaStream_t s = stream;
    bf16_t* dq = dequant.as<bf16_t>();
    linear(g, in, sh_g.as<float>(), T, dq, s);
    linear(u, in, sh_u.as<float>(), T, dq, s);
    silu_mul(sh_g.as<float>(), sh_u.as<float>(), sh_h.as<bf16_t>(), int64_t(T) * g.out, s);
    linear(dn, sh_h.as<bf16_t>(), out, T, dq, s);
  }

  // The shared expert of a MoE layer: output in sh_out; returns where token t's gate logit is
  // (at [t * gate_ld]), or null without a shared expert.
  const float* shared_expert(const DevLayer& l, int T, cudaStream_t s, int64_t* gate_ld) {
    Scope sc(this, "moe.shared");
    bf16_t* dq = dequant.as<bf16_t>();
    if (l.has_shared && l.s_fused.out > 0) {
      const int S = l.s_down.in;
      linear(l.s_fused, xn.as<bf16_t>(), sh_g.as<float>(), T, dq, s);
      silu_mul_rows(sh_g.as<float>(), l.s_fused.out, sh_h.as<bf16_t>(), T, S, s);
      linear(l.s_down, sh_h.as<bf16_t>(), sh_out.as<float>(), T, dq, s);
      *gate_ld = l.s_fused.out;
      return sh_g.as<float>() + 2 * S;
    }
    if (l.has_shared) {
      mlp_block(l.s_gate, l.s_up, l.s_down, xn.as<bf16_t>(), sh_out.as<float>(), T);
      linear(l.s_gate_logit, xn.as<bf16_t>(), sh_gate.as<float>(), T, dq, s);
      *gate_ld = 1;
      return sh_gate.as<float>();
    }
    return nullptr;
  }

  // Prefill-sized steps route with the split bf16 product; decode and verify stay exact fp32.
  static bool router_split(const DevLayer& l, int T) { return T > kSplitTokens && l.router3.bf16; }

  void moe_block(const DevLayer& l, const Plan& p) {
    const cudaStream_t s = stream;
    const int T = p.T, H = cfg.hidden_size, E = cfg.num_experts, K = cfg.num_experts_per_tok;
    bf16_t* dq = dequant.as<bf16_t>();
    float* D = delta.as<float>();
    // Only at GEMV sizes: there no cuBLASLt call (one shared workspace) runs on either stream.
    const bool overlap = l.packed && l.has_shared && l.s_fused.out > 0 && T <= kGemvMaxTokens && !opt.profile;
    const cudaStream_t shared_stream = overlap ? side_stream : s;
    if (overlap) {
      FATHOM_CUDA_CHECK(cudaEventRecord(fork_event, s));
      FATHOM_CUDA_CHECK(cudaStreamWaitEvent(side_stream, fork_event));
    }
    const float* shared_gate = nullptr;
    int64_t gate_ld = 1;
    if (overlap) shared_gate = shared_expert(l, T, shared_stream, &gate_ld);
    {
      Scope sc(this, "moe.router");
      if (router_split(l, T)) {  // router_x3 from the norm before the block
        gemm_bf16(router_x3.as<bf16_t>(), l.router3.bf16, router_logits.as<float>(), T, E, 3 * H, s);
      } else {
        linear_f32(l.router, xn32.as<float>(), router_logits.as<float>(), T, s);
      }
      moe_topk(router_logits.as<float>(), topk_ids.as<int32_t>(), topk_w.as<float>(), T, E, K, cfg.norm_topk_prob, s);
    }
    if (!overlap) shared_gate = shared_expert(l, T, s, &gate_ld);
    Scope sc(this, "moe.experts");
    const float* shared = l.has_shared ? sh_out.as<float>() : nullptr;
    if (l.packed) {
      moe_experts_fp4(l.pexperts, xn.as<bf16_t>(), topk_ids.as<int32_t>(), topk_w.as<float>(), pair_h.as<bf16_t>(),
                      pair_out.as<float>(), nullptr, T, K, shared, shared_gate, gate_ld, group, s);
      if (overlap) {
        FATHOM_CUDA_CHECK(cudaEventRecord(join_event, side_stream));
        FATHOM_CUDA_CHECK(cudaStreamWaitEvent(s, join_event));
      }
      moe_combine_pairs(pair_out.as<float>(), D, T, K, H, shared, shared_gate, gate_ld, s);
    } else if (T * K <= pair_limit) {
      // Writes D, shared expert included; grouping pays off once experts repeat.
      moe_experts_decode(l.experts, xn.as<bf16_t>(), topk_ids.as<int32_t>(), topk_w.as<float>(), pair_h.as<bf16_t>(),
                         pair_out.as<float>(), D, T, K, shared, shared_gate, gate_ld, s, T >= 4 ? &group : nullptr);
    } else {
      FATHOM_CUDA_CHECK(cudaMemsetAsync(D, 0, size_t(T) * H * 4, s));
      // Large batches: group tokens by expert on the host, then one GEMM chain per expert.
      std::vector<int32_t> ids(size_t(T) * K);
      std::vector<float> w(size_t(T) * K);
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(ids.data(), topk_ids.data(), ids.size() * 4, cudaMemcpyDeviceToHost, s));
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(w.data(), topk_w.data(), w.size() * 4, cudaMemcpyDeviceToHost, s));
      FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<std::vector<int32_t>> rows(E);
      std::vector<std::vector<float>> wts(E);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) {
          rows[ids[size_t(t) * K + k]].push_back(t);
          wts[ids[size_t(t) * K + k]].push_back(w[size_t(t) * K + k]);
        }
      std::vector<int32_t> all_rows;
      std::vector<float> all_w;
      std::vector<int> offset(E + 1, 0);
      for (int e = 0; e < E; ++e) {
        offset[e] = int(all_rows.size());
        all_rows.insert(all_rows.end(), rows[e].begin(), rows[e].end());
        all_w.insert(all_w.end(), wts[e].begin(), wts[e].end());
      }
      offset[E] = int(all_rows.size());
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(eg_rows.data(), all_rows.data(), all_rows.size() * 4, cudaMemcpyHostToDevice, s));
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(eg_w.data(), all_w.data(), all_w.size() * 4, cudaMemcpyHostToDevice, s));
      for (int e = 0; e < E; ++e) {
        const int m = offset[e + 1] - offset[e];
        if (m == 0) continue;
        const int32_t* r = eg_rows.as<int32_t>() + offset[e];
        gather_rows_bf16(xn.as<bf16_t>(), r, eg_x.as<bf16_t>(), m, H, s);
        linear(l.ex_gate[e], eg_x.as<bf16_t>(), eg_g.as<float>(), m, dq, s);
        linear(l.ex_up[e], eg_x.as<bf16_t>(), eg_u.as<float>(), m, dq, s);
        silu_mul(eg_g.as<float>(), eg_u.as<float>(), eg_h.as<bf16_t>(), int64_t(m) * l.ex_gate[e].out, s);
        linear(l.ex_down[e], eg_h.as<bf16_t>(), eg_o.as<float>(), m, dq, s);
        scatter_add_rows(D, eg_o.as<float>(), r, eg_w.as<float>() + offset[e], m, H, s);
      }
      // The host vectors above must outlive the async copies.
      FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
      if (shared) add_sigmoid_gated(D, shared, shared_gate, gate_ld, T, H, s);
    }
  }

  // Final norm and lm_head over the selected rows; argmax on the device.
  void head(const Plan& p) { head(p, w.final_norm); }
  void head(const Plan& p, const float* norm) {
    const cudaStream_t s = stream;
    const int H = cfg.hidden_size, V = cfg.vocab_size;
    Scope sc(this, "lm_head");
    gather_rows_f32(x.as<float>(), dmeta.rows, sel.as<float>(), p.R, H, s);
    rms_norm(sel.as<float>(), norm, hidden_bf.as<bf16_t>(), sel.as<float>(), p.R, H, float(cfg.rms_norm_eps),
             cfg.norm_zero_centered, s);
    const bf16_t* head_in = hidden_bf.as<bf16_t>();
    if (p.RL < p.R) {  // all_hidden steps: logits for a subset of the rows (xn is free by now)
      gather_rows_bf16(hidden_bf.as<bf16_t>(), dmeta.logit_rows, xn.as<bf16_t>(), p.RL, H, s);
      head_in = xn.as<bf16_t>();
    }
    gemm_bf16(head_in, w.lm_head, logits.as<float>(), p.RL, V, H, s);
    argmax_rows(logits.as<float>(), argmax.as<int32_t>(), p.RL, V, s);
  }

  void run(const Plan& p) {
    // Programmatic dependent launch pays at decode sizes (launch gaps between small kernels) and
    // costs at prefill sizes (waiting blocks hold SM resources): on for up to kSplitTokens tokens.
    set_programmatic_launch(p.T <= kSplitTokens);
    const bool graphable = opt.cuda_graphs && !opt.profile && p.graphable &&
                           p.T * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
    if (!graphable) {
      run_layers(p);
      head(p);
      collect_profile();
      return;
    }
    const GraphKey key{p.T, p.S, p.R, hist_step};
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      cudaGraph_t g;
      FATHOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      try {
        run_layers(p);
        head(p);
      } catch (...) {  // leave the stream usable: end (and drop) the broken capture
        if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        cudaGetLastError();
        throw;
      }
      FATHOM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
      cudaGraphExec_t exec;
      FATHOM_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
      cudaGraphDestroy(g);
      it = graphs.emplace(key, exec).first;
    }
    FATHOM_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
  }

  // MTP rows of each step sit at positions mtp_length.. of its sequence (the positions of the
  // hidden states they consume), in the MTP layer's own KV pool with the sequence's block table.
  Plan prepare_mtp(std::span<const MtpStep> steps) {
    Plan p;
    p.S = int(steps.size());
    FATHOM_CHECK(p.S <= opt.max_seqs, "batch of ", p.S, " sequences exceeds max_seqs ", opt.max_seqs);
    p.graphable = false;
    hist_step = false;
    const int H = cfg.hidden_size;
    std::vector<float> hidden;
    hmeta.seq_start[0] = 0;
    for (int i = 0; i < p.S; ++i) {
      const MtpStep& st = steps[i];
      Sequence& sq = seq(st.seq);
      const int n = int(st.next_tokens.size());
      FATHOM_CHECK(n > 0 && int64_t(st.hidden.size()) == int64_t(n) * H, "mtp_forward: hidden rows (",
                   st.hidden.size() / H, ") and next tokens (", n, ") differ");
      FATHOM_CHECK(p.T + n <= T_max && p.R + (st.all_rows ? n : 1) <= R_max, "mtp_forward: batch of ", p.T + n,
                   " tokens larger than one engine step (", T_max, " tokens, ", R_max, " rows)");
      hmeta.keep_hist[i] = 0;
      // Chained drafts run ahead of the verified tokens; the block table grows for them and the
      // main pools use the same blocks at those positions later.
      add_to_plan(p, i, st.seq, sq, sq.mtp_length, st.next_tokens, st.all_rows);
      hidden.insert(hidden.end(), st.hidden.begin(), st.hidden.end());
    }
    upload_meta(p.S);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(mtp_hidden.data(), hidden.data(), hidden.size() * 4, cudaMemcpyHostToDevice,
                                      stream));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // `hidden` is a local
    return p;
  }

  // u = fc([norm_e(embed(next)) | norm_h(hidden)]), one full-attention MoE layer, mtp.norm, lm_head.
  void run_mtp(const Plan& p) {
    const cudaStream_t s = stream;
    const int H = cfg.hidden_size, T = p.T;
    const float eps = float(cfg.rms_norm_eps);
    const bool zc = cfg.norm_zero_centered;
    float* X = x.as<float>();
    float* D = delta.as<float>();
    bf16_t* dq = dequant.as<bf16_t>();
    embedding(dmeta.ids, w.embed, X, T, H, s);
    rms_norm(X, w.mtp_norm_e, mtp_e.as<bf16_t>(), nullptr, T, H, eps, zc, s);
    rms_norm(mtp_hidden.as<float>(), w.mtp_norm_h, mtp_h.as<bf16_t>(), nullptr, T, H, eps, zc, s);
    linear(w.mtp_fc_e, mtp_e.as<bf16_t>(), X, T, dq, s);
    linear(w.mtp_fc_h, mtp_h.as<bf16_t>(), D, T, dq, s);
    add_inplace(X, D, int64_t(T) * H, s);
    decoder_layer(w.mtp_layer, p, /*first=*/true);  // u is the residual stream; nothing to add yet
    add_inplace(X, D, int64_t(T) * H, s);
    head(p, w.mtp_norm);
  }

  // Rows forward() returns for `steps`: logits rows (n per all_rows step, else 1) and hidden rows
  // (n per all_rows or all_hidden step, else 1), each step's first row of both.
  struct OutputLayout {
    int64_t rows = 0, hidden_rows = 0;
    std::vector<int64_t> row_begin, hidden_row_begin;
  };
  static OutputLayout output_layout(std::span<const ForwardStep> steps) {
    OutputLayout o;
    for (const ForwardStep& st : steps) {
      o.row_begin.push_back(o.rows);
      o.rows += st.all_rows ? int64_t(st.tokens.size()) : 1;
      o.hidden_row_begin.push_back(o.hidden_rows);
      o.hidden_rows += st.all_rows || st.all_hidden ? int64_t(st.tokens.size()) : 1;
    }
    return o;
  }

  // Where each piece of a chunk (from for_each_chunk) comes from: its original step, its first
  // token inside that step, and whether it ends the step.
  struct Piece {
    size_t step = 0;
    int64_t offset = 0, n = 0;
    bool last = false;
  };
  static std::vector<Piece> pieces_of(std::span<const ForwardStep> steps, std::span<const ForwardStep> batch) {
    std::vector<Piece> out;
    size_t si = 0;  // pieces come in step order
    for (const ForwardStep& piece : batch) {
      auto inside = [&](size_t k) {
        return piece.tokens.data() >= steps[k].tokens.data() &&
               piece.tokens.data() < steps[k].tokens.data() + steps[k].tokens.size();
      };
      while (si < steps.size() && !inside(si)) ++si;
      FATHOM_CHECK(si < steps.size(), "forward: a chunk piece belongs to no step");
      const ForwardStep& st = steps[si];
      Piece pc;
      pc.step = si;
      pc.offset = piece.tokens.data() - st.tokens.data();
      pc.n = int64_t(piece.tokens.size());
      pc.last = pc.offset + pc.n == int64_t(st.tokens.size());
      out.push_back(pc);
    }
    return out;
  }

  // Splits steps so each forward fits T_max tokens, R_max rows and max_seqs sequences.
  template <class Fn>
  void for_each_chunk(std::span<const ForwardStep> steps, Fn&& fn) {
    std::vector<ForwardStep> batch;
    int tokens = 0, rows = 0;
    auto flush = [&] {
      if (batch.empty()) return;
      fn(std::span<const ForwardStep>(batch));
      batch.clear();
      tokens = rows = 0;
    };
    for (size_t i = 0; i < steps.size(); ++i) {
      ForwardStep st = steps[i];
      size_t done = 0;
      while (done < st.tokens.size()) {
        const int room_t = T_max - tokens, room_r = R_max - rows;
        const bool rows_each = st.all_rows || st.all_hidden;  // one output row per token
        int n = int(std::min<size_t>(st.tokens.size() - done, size_t(room_t)));
        if (rows_each) n = std::min(n, room_r);
        const bool last_piece = done + size_t(n) == st.tokens.size();
        // A keep_history step (draft verification) is never split: its state history is per step.
        const bool split_history = st.keep_history && !last_piece && !batch.empty();
        if (n <= 0 || (!rows_each && last_piece && room_r < 1) || int(batch.size()) >= opt.max_seqs ||
            split_history) {
          flush();
          continue;
        }
        ForwardStep piece = st;
        piece.tokens = st.tokens.subspan(done, size_t(n));
        batch.push_back(piece);
        tokens += n;
        rows += rows_each ? n : 1;
        done += size_t(n);
        if (!last_piece) flush();  // the rest of this sequence goes after this piece
      }
    }
    flush();
  }
};

}  // namespace fathom::cuda
