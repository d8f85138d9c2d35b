// The CUDA engine's state and step machinery (CudaRunner::Impl): caches and buffers, step plans
// and metadata. Its parts live in files by concept: runner_memory.cpp (the memory plan),
// runner_layers.cpp (the layers, lm_head, the MTP step), runner_graphs.cpp (graph buckets and
// capture), runner_sampling.cpp (device sampling, launched and finished steps) and
// cuda_runner.cpp (the public methods: sequences, forward passes, rollback).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <numeric>
#include <optional>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/stream_communicator.h"
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

  ModelConfig cfg;        // as this rank holds it (rank_config): its heads and widths
  ModelConfig model_cfg;  // the whole model's, which config() reports
  CudaRunnerOptions opt;
  TensorSplit tp;               // this rank's slice (whole on one GPU)
  Communicator* comm = nullptr;  // tensor-parallel group, or null (no collectives)
  DeviceBuffer logits_part, logits_all;  // split lm_head: this rank's vocabulary slice, every rank's
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
  // Prefix snapshots: KV blocks of the pools set aside for them, and linear states of their own
  // ([layer][snapshot slot][...]).
  struct Snapshot {
    std::vector<int32_t> blocks;
    int slot = -1;
    int64_t length = 0, mtp_length = 0;
  };
  std::map<int64_t, Snapshot> snapshots;
  int64_t next_snapshot = 1;
  std::vector<int32_t> snap_free_blocks;
  std::vector<int> snap_free_slots;
  DeviceBuffer snap_conv, snap_rec, pool_ptrs, copy_idx;
  int64_t snap_tokens = 0;  // KV room of the snapshots (opt.snapshot_tokens, or less where it did not fit)
  void copy_blocks(const std::vector<int32_t>& src, const std::vector<int32_t>& dst);
  // The linear states of slot `from` of (base, slots) into slot `to` of (dst, dst_slots), all layers.
  void copy_state(const float* base, int base_slots, int from, float* dst, int dst_slots, int to, int64_t per_slot);
  void copy_states(bool into_snapshot, int slot, int snap_slot);
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
  // MTP draft steps, captured the second time a shape is seen (the first, eager, makes the lazy
  // resources that cannot be made while capturing).
  std::map<GraphKey, cudaGraphExec_t> mtp_graphs;
  std::set<GraphKey> mtp_seen;
  float* mtp_hidden_host = nullptr;  // pinned: an MTP step's hidden rows go up without a wait
  OpProfile prof;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> pending_events;

  // Device sampling (runner_sampling.cpp): each logits row's parameters and result, mirrored in
  // pinned host memory; the adjustment list grows on demand.
  // Pinned inputs and outputs are double-buffered (alternate launches): a launched step's copies
  // may still be pending, and its results stay readable, while the next step is prepared.
  DeviceBuffer row_params, row_out, row_top_ids, row_top_lp, adjust_dev;
  RowSampling* row_params_host[2] = {};
  RowSample* row_out_host[2] = {};
  int32_t* row_top_ids_host[2] = {};
  float* row_top_lp_host[2] = {};
  LogitAdjustment* adjust_host[2] = {};
  size_t adjust_cap[2] = {};
  DeviceBuffer mask_dev;              // the step's token masks (structured output), grown on demand
  uint32_t* mask_host[2] = {};
  size_t mask_cap[2] = {};            // words
  int io_buf = 0;
  // The token each state slot's last sampled row chose (kPendingToken's value on the device).
  DeviceBuffer last_token;
  // Recorded after a step's metadata copy: the pinned metadata is rewritten only after it.
  cudaEvent_t meta_uploaded = nullptr;

  // n rows from row `from` of a chunk's output to row `to` of the step's.
  struct RowCopy {
    int64_t from, to, n;
  };
  // A launched sampled chunk whose results are not read yet (runner_sampling.cpp).
  struct SampledChunk {
    int RL = 0, R = 0, buf = 0;
    int32_t n_adjust = 0;             // adjustments uploaded for its rows
    std::vector<int64_t> source;  // logits row -> row of the launched steps (-1: nobody reads it)
    std::vector<int32_t> mask_source;  // its i-th mask -> row of the caller's mask table
    std::vector<RowCopy> hidden_copies;
    std::vector<float> hidden;
  };
  struct LaunchedStep {
    bool any_logprobs = false, want_hidden = false;
    std::vector<char> wants_logprobs;  // per row
    SampledOutput out;
    std::optional<SampledChunk> chunk;
  };
  std::deque<LaunchedStep> launched;  // oldest first; at most two (overlapped scheduling)
  cudaEvent_t chunk_done[2] = {};     // per output buffer: its chunk's results have arrived
  void scatter(LaunchedStep& ls, const SampledChunk& c);
  // A launched chunk's sampler and output copies (at launch, or when its masks arrive).
  void sample_chunk(LaunchedStep& ls, SampledChunk c, std::span<const uint32_t> masks);
  std::optional<SampledChunk> deferred;  // the last launch's chunk, forward queued, waiting for masks

  // Decode steps run the shared expert on a second stream, beside the router and the routed
  // experts (independent until the combine): at batch 1 each is too small to fill the GPU.
  cudaStream_t side_stream = nullptr;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;

  // Sets the model (whole config) and this rank's view of it from opt.split.
  void set_model(const ModelConfig& whole) {
    model_cfg = whole;
    tp = opt.split.is_split() ? opt.split : TensorSplit::whole(whole);
    cfg = rank_config(whole, tp);
    comm = opt.communicator;
    FATHOM_CHECK(!tp.is_split() || comm, "a split model needs a communicator");
    FATHOM_CHECK(!tp.is_split() || whole.vocab_size % tp.size == 0, "the CUDA engine splits lm_head evenly: vocabulary ",
                 whole.vocab_size, " does not split over ", tp.size, " GPUs");
  }

  void init_device() {
    int count = 0;
    FATHOM_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count > 0, "--device cuda: no CUDA device is visible");
    FATHOM_CHECK(opt.device >= 0 && opt.device < count, "GPU ", opt.device, " is not visible (", count, " are)");
    FATHOM_CUDA_CHECK(cudaSetDevice(opt.device));
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
    if (auto* device_comm = dynamic_cast<StreamCommunicator*>(comm)) device_comm->set_stream(stream);
  }

  // Tensor parallel: the sum over ranks of a layer's partial output [T, hidden] (fp32, in place).
  void reduce_partial(float* data, int T) {
    if (!comm) return;
    Scope sc(this, "allreduce");
    comm->all_reduce_sum(std::span<float>(data, size_t(T) * cfg.hidden_size));
  }

  ~Impl() {
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    for (auto& [k, g] : mtp_graphs) cudaGraphExecDestroy(g);
    if (mtp_hidden_host) cudaFreeHost(mtp_hidden_host);
    for (auto& p : pending_events) cudaEventDestroy(p.second.first), cudaEventDestroy(p.second.second);
    if (meta_host) cudaFreeHost(meta_host);
    for (int b = 0; b < 2; ++b)
      for (void* p : {(void*)row_params_host[b], (void*)row_out_host[b], (void*)row_top_ids_host[b],
                      (void*)row_top_lp_host[b], (void*)adjust_host[b], (void*)mask_host[b]})
        if (p) cudaFreeHost(p);
    if (meta_uploaded) cudaEventDestroy(meta_uploaded);
    for (cudaEvent_t e : chunk_done)
      if (e) cudaEventDestroy(e);
    if (fork_event) cudaEventDestroy(fork_event);
    if (join_event) cudaEventDestroy(join_event);
    if (side_stream) cudaStreamDestroy(side_stream);
    if (stream) cudaStreamDestroy(stream);
  }

  // ---- caches, states and scratch
  void allocate_runtime();
  // The ops that run generic kernels for this model's shapes (kernel_coverage.h), on stderr.
  void log_generic_kernels() const;

  int64_t kv_bytes_per_token() const {
    return int64_t(n_attn + (w.has_mtp ? 1 : 0)) * 2 * cfg.num_key_value_heads * cfg.head_dim * 2;
  }
  // One slot's linear-attention state in one layer, in floats: the conv window and the recurrent
  // state (the layout of conv_state / rec_state, the snapshots' and the history's).
  struct StateSizes {
    int64_t conv = 0, rec = 0;
  };
  StateSizes state_sizes() const {
    const int64_t conv_dim = 2 * int64_t(cfg.linear_num_key_heads) * cfg.linear_key_head_dim +
                             int64_t(cfg.linear_num_value_heads) * cfg.linear_value_head_dim;
    return {(cfg.linear_conv_kernel_dim - 1) * conv_dim,
            int64_t(cfg.linear_num_value_heads) * cfg.linear_key_head_dim * cfg.linear_value_head_dim};
  }
  int64_t history_bytes() const {
    const StateSizes z = state_sizes();
    return int64_t(n_linear) * slots * (opt.max_history + 1) * (z.conv + z.rec) * 4;
  }

  // The KV pools come last: with gpu_memory_utilization they take what the weights, states and
  // scratch leave of that share of the device, less a reserve for CUDA graphs and cuBLASLt
  // workspaces (made later) and, when drafts will be verified, the state history.
  void allocate_kv_pools();

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
      if ((t < 0 && t != kPendingToken) || t >= cfg.vocab_size)
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
      hmeta.ids[t] = tokens[j] == kPendingToken ? -1 - sq.slot : tokens[j];
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

  // The pinned metadata is rewritten only after the step before has copied it (that step may still
  // be running: overlapped scheduling).
  void wait_uploads() { FATHOM_CUDA_CHECK(cudaEventSynchronize(meta_uploaded)); }

  Plan prepare(std::span<const ForwardStep> steps) {
    wait_uploads();
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

  void start_up_graphs();

  // Captures the graphs of every decode bucket (a step of padding rows only), so that serving
  // never stops to capture. Returns the buckets and the device memory the graphs took.
  std::pair<int, int64_t> capture_decode_graphs();

  // The step's metadata to the device: the block tables come last, so only the rows of the
  // step's S sequences travel (each row is max_seq_len / block_size wide, 16,384 entries at
  // 262,144 tokens).
  void upload_meta(int S) {
    const size_t ints = meta_ints - size_t(opt.max_seqs - S) * size_t(max_blocks);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(meta_dev.data(), meta_host, ints * 4, cudaMemcpyHostToDevice, stream));
    FATHOM_CUDA_CHECK(cudaEventRecord(meta_uploaded, stream));
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
  void decoder_layer(const DevLayer& l, const Plan& p, bool first);

  void run_layers(const Plan& p);

  void attention_block(const DevLayer& l, const Plan& p);

  // Attention over the paged cache, by the plan's runs: prefill runs on the tensor-core prefill
  // kernel, decode and verify tokens on the tensor-core split-K decode kernel, kSplitTokens tokens
  // at a time; the CUDA-core kernels take head sizes those do not cover. Steps holding a prefill
  // chunk are never graph-captured, so deciding on the host is safe.
  void attend(const DevLayer& l, const Plan& p);

  void gdn_block(const DevLayer& l, const Plan& p);

  void mlp_block(const DeviceLinear& g, const DeviceLinear& u, const DeviceLinear& dn, const bf16_t* in, DeviceArray<float> out,
                 int T);

  // The shared expert of a MoE layer: output in sh_out; returns where token t's gate logit is
  // (at [t * gate_ld]), or null without a shared expert.
  const float* shared_expert(const DevLayer& l, int T, cudaStream_t s, int64_t* gate_ld);

  // Prefill-sized steps route with the split bf16 product; decode and verify stay exact fp32.
  static bool router_split(const DevLayer& l, int T) { return T > kSplitTokens && l.router3.bf16; }

  void moe_block(const DevLayer& l, const Plan& p);

  // Final norm and lm_head over the selected rows; argmax on the device.
  void head(const Plan& p) { head(p, w.final_norm); }
  void head(const Plan& p, const float* norm);

  void run(const Plan& p);
  // Replays body's kernels from `cache` under the plan's key, capturing them the first time
  // (decode and verify steps) or, given `seen`, the second time the key comes (MTP steps).
  template <class Body>
  void replay(std::map<GraphKey, cudaGraphExec_t>& cache, const Plan& p, Body&& body, std::set<GraphKey>* seen);
  void run_mtp_step(const Plan& p);

  // MTP rows of each step sit at positions mtp_length.. of its sequence (the positions of the
  // hidden states they consume), in the MTP layer's own KV pool with the sequence's block table.
  // With inputs_on_device the steps' hidden rows and next tokens are not read (the caller copies
  // them into mtp_hidden and the token ids on the device after this returns).
  Plan prepare_mtp(std::span<const MtpStep> steps, bool inputs_on_device = false);
  // After an MTP step has been launched: its hidden rows to the host (when `hidden` is given), a
  // wait for the step, and each sequence's MTP length advanced.
  void finish_mtp(std::span<const MtpStep> steps, const Plan& p, std::vector<float>* hidden) {
    if (hidden) {
      hidden->resize(size_t(p.R) * cfg.hidden_size);
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(hidden->data(), sel.data(), hidden->size() * 4, cudaMemcpyDeviceToHost, stream));
    }
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const MtpStep& st : steps) seq(st.seq).mtp_length += int64_t(st.next_tokens.size());
  }

  // u = fc([norm_e(embed(next)) | norm_h(hidden)]), one full-attention MoE layer, mtp.norm, lm_head.
  void run_mtp(const Plan& p);

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
  // token inside that step, and whether it ends the step. Recorded as the chunks are cut, not
  // recovered from the token pointers: steps may share token storage (prefixes of one array).
  struct Piece {
    size_t step = 0;
    int64_t offset = 0, n = 0;
    bool last = false;
  };

  // Where a chunk's hidden rows go in the step's output: every row of an all_rows or all_hidden
  // piece, else the last piece's one row.
  static std::vector<RowCopy> hidden_copies(std::span<const ForwardStep> steps, const std::vector<Piece>& pieces,
                                            const Plan& p, const std::vector<int64_t>& hidden_row_begin) {
    std::vector<RowCopy> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& pc = pieces[i];
      const ForwardStep& st = steps[pc.step];
      if (st.all_rows || st.all_hidden) out.push_back({p.row_begin[i], hidden_row_begin[pc.step] + pc.offset, pc.n});
      else if (pc.last) out.push_back({p.row_begin[i], hidden_row_begin[pc.step], 1});
    }
    return out;
  }

  // Splits steps so each forward fits T_max tokens, R_max rows and max_seqs sequences; calls
  // fn(batch, pieces) for each chunk (pieces[i]: where batch[i] comes from).
  template <class Fn>
  void for_each_chunk(std::span<const ForwardStep> steps, Fn&& fn) {
    std::vector<ForwardStep> batch;
    std::vector<Piece> pieces;
    int tokens = 0, rows = 0;
    auto flush = [&] {
      if (batch.empty()) return;
      fn(std::span<const ForwardStep>(batch), static_cast<const std::vector<Piece>&>(pieces));
      batch.clear();
      pieces.clear();
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
        pieces.push_back(Piece{i, int64_t(done), int64_t(n), last_piece});
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
