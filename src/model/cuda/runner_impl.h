// The CUDA engine's state and step machinery (CudaRunner::Impl). Its parts, by concept:
// activations (runner_activations.h: every step buffer, sized in one place), the DeltaNet state
// pool (linear_state_pool.h), the step plan (step_plan.h: chunks, rows, graph buckets) and its
// metadata (runner_step.cpp), the memory plan (runner_memory.cpp), the layers, lm_head and MTP
// step (runner_layers.cpp), graph buckets and capture (runner_graphs.cpp), device sampling and
// launched steps (runner_sampling.cpp), prefix snapshots (runner_snapshots.cpp), and the public
// methods: sequences, forward passes, rollback (cuda_runner.cpp).
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
#include "model/cuda/graph_cache.h"
#include "model/cuda/host_snapshot_pool.h"
#include "model/cuda/kv_pool.h"
#include "model/cuda/linear_state_pool.h"
#include "model/cuda/op_profiler.h"
#include "model/cuda/runner_activations.h"
#include "model/cuda/sampling_buffers.h"
#include "model/cuda/step_plan.h"

namespace fathom::cuda {
namespace runner_detail {

struct Sequence {
  int64_t length = 0;
  int slot = -1;
  std::vector<int32_t> blocks;
  int64_t hist_base = -1, hist_len = 0;  // the last keep_history step: start and token count
  int64_t mtp_length = 0;                // positions the MTP layer has consumed
  // A chained round was launched after a round not read yet: the lengths above are as if that
  // round accepted no draft, until it is read (CudaRunner::finish_verify_draft adds what it did).
  bool awaiting_outcome = false;
  // The draft a sampled fused round drew for this sequence: its position (RowSampling::draw) and
  // token, its q in SamplingBuffers::q_kept at this sequence's slot (token -1: none). round_draws:
  // the round last launched draws it (a round chained to that one verifies against its q);
  // round_a: the drafts the round last read accepted (a chained round's rows drew that far further).
  uint64_t kept_draw = 0;
  int32_t kept_token = -1;
  bool round_draws = false;
  int round_a = 0;
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
  cudaStream_t stream = nullptr;
  DeviceWeights w;
  Footprint fp;
  int n_attn = 0, n_linear = 0;

  KvPool kv;  // the KV cache's memory (kv_pool.h); the blocks' accounting below
  std::vector<int32_t> free_blocks;
  LinearStatePool states;  // the DeltaNet states of the slots (linear_state_pool.h)
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
    bool copied_in = false;  // written by a host-tier copy the runner's stream has not waited for
  };
  std::map<int64_t, Snapshot> snapshots;
  int64_t next_snapshot = 1;  // the host tier's ids too
  std::vector<int32_t> snap_free_blocks;
  std::vector<int> snap_free_slots;
  std::optional<Snapshot> take_snapshot_room(size_t blocks);
  void free_snapshot_room(const Snapshot& snap);
  // The host tier (--prefix-cache-host-gb): a snapshot's blocks as pages of pinned host memory
  // and its linear states as one piece there. Copies run on copy_stream, after the work queued
  // on `stream` when they are made (which wrote what they read); `copies_done` marks the last.
  struct HostSnapshot {
    std::vector<char*> pages;
    char* state = nullptr;
    int64_t length = 0, mtp_length = 0;
  };
  std::map<int64_t, HostSnapshot> host_snapshots;
  HostSnapshotPool host_pool;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t stream_ready = nullptr, copies_done = nullptr;
  // Snapshot room a host-tier copy may still read or write is among the free lists: the next
  // use on `stream` waits for the copies first.
  bool snap_room_in_copy = false;
  void begin_copies();  // copy_stream waits for the work queued on `stream` so far
  void end_copies();    // records copies_done
  // Snapshot room taken on `stream`: after any copy still using it.
  void wait_copies_if(bool& pending);
  int64_t snap_tokens = 0;  // KV room of the snapshots (opt.snapshot_tokens, or less where it did not fit)
  // The linear states of slot `from` of (base, slots) into slot `to` of (dst, dst_slots), all layers.
  int max_blocks = 0;
  int64_t kv_tokens = 0;  // the KV pools' capacity

  // The step's buffers (runner_activations.h) and the limits they are sized for.
  int T_max = 0, R_max = 0, pair_limit = 0;
  Activations act;
  DeviceBuffer meta_dev;
  int32_t* meta_host = nullptr;
  size_t meta_ints = 0;
  Meta dmeta{}, hmeta{};

  // MTP draft layer (optional, in w): its own full-attention layer and KV pool (index n_attn).
  bool hist_step = false;  // the current forward records history

  // Decode and verify steps replay CUDA graphs (graph_cache.h), as do MTP draft steps; each shape
  // is captured the second time it is seen, after an eager run has made what a capture cannot
  // (buckets captured at first sight failed in cuBLASLt with status 13: docs/perf.md, stop 74).
  GraphCache graphs{/*capture_on_second_sight=*/true}, mtp_graphs{/*capture_on_second_sight=*/true};
  float* mtp_hidden_host = nullptr;  // pinned: an MTP step's hidden rows go up without a wait
  OpProfiler profiler;  // --profile: per-op-group CUDA-event timings

  SamplingBuffers sampling;  // the device sampler's (sampling_buffers.h, runner_sampling.cpp)
  // Recorded after a step's metadata copy: the pinned metadata is rewritten only after it.
  cudaEvent_t meta_uploaded = nullptr;

  using RowCopy = cuda::RowCopy;
  using Piece = cuda::Piece;
  // A launched sampled chunk whose results are not read yet (runner_sampling.cpp).
  struct SampledChunk {
    int RL = 0, R = 0, buf = 0;
    int32_t n_adjust = 0;             // adjustments uploaded for its rows
    std::vector<int64_t> source;  // logits row -> row of the launched steps (-1: nobody reads it)
    std::vector<int32_t> mask_source;  // its i-th mask -> row of the caller's mask table
    std::vector<int32_t> kept;         // its rows whose raw logits return (RowSampling::keep_logits)
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
  void scatter(LaunchedStep& ls, const SampledChunk& c);
  // A launched chunk's sampler and output copies (at launch, or when its masks arrive).
  void sample_chunk(LaunchedStep& ls, SampledChunk c, std::span<const uint32_t> masks);
  std::optional<SampledChunk> deferred;  // the last launch's chunk, forward queued, waiting for masks

  // Chained MTP rounds (runner_mtp_round.cpp): each state slot's last round outcome on the device
  // (chain_tok: the next round's two tokens, chain_a: the drafts it accepted), the MTP layer's
  // drafts of the round being launched (chain_draft, T_max) and the round's outputs (round_out: S
  // accepted counts, T targets, T drafts, then a sampled round's T chosen RowSamples), copied in
  // one piece to one of two pinned buffers per launched round.
  DeviceBuffer chain_dev;
  // A sampled round's chosen tokens (chain_fed, T_max) are the MTP step's input.
  int32_t *chain_tok = nullptr, *chain_a = nullptr, *chain_draft = nullptr, *chain_fed = nullptr, *round_out = nullptr;
  int32_t* round_host[2] = {nullptr, nullptr};
  cudaEvent_t round_done[2] = {nullptr, nullptr};
  int round_buf = 0;
  struct LaunchedRound {
    int buf = 0, T = 0, S = 0;
    bool chained = false;
    std::vector<int64_t> row_begin;
    std::vector<SequenceId> seqs;
    // A sampled round (rows given): its rows' draws as uploaded (a chained round's are round_a
    // further on the device), which rows draw their drafts, and whether any row wants logprobs.
    bool sampled = false, any_logprobs = false;
    std::vector<uint64_t> draw;
    std::vector<char> draws_draft;
  };
  std::deque<LaunchedRound> rounds;  // oldest first; at most two
  void ensure_chain_buffers();

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
    profiler.start(opt.profile, stream);
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
    if (auto* device_comm = dynamic_cast<StreamCommunicator*>(comm)) device_comm->set_stream(stream);
  }

  // Tensor parallel: the sum over ranks of a layer's partial output [T, hidden] (fp32, in place).
  void reduce_partial(float* data, int T) {
    if (!comm) return;
    Scope sc(profiler, "allreduce");
    comm->all_reduce_sum(std::span<float>(data, size_t(T) * cfg.hidden_size));
  }

  ~Impl() {
    if (copy_stream) cudaStreamSynchronize(copy_stream);  // before host_pool unpins what it copies
    if (copy_stream) cudaStreamDestroy(copy_stream);
    if (stream_ready) cudaEventDestroy(stream_ready);
    if (copies_done) cudaEventDestroy(copies_done);
    if (mtp_hidden_host) cudaFreeHost(mtp_hidden_host);
    for (int b = 0; b < 2; ++b) {
      if (round_host[b]) cudaFreeHost(round_host[b]);
      if (round_done[b]) cudaEventDestroy(round_done[b]);
    }
    if (meta_host) cudaFreeHost(meta_host);
    if (meta_uploaded) cudaEventDestroy(meta_uploaded);
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
    return int64_t(n_attn + (w.has_mtp ? 1 : 0)) * cfg.kv_bytes_per_token_per_layer(opt.kv_cache_dtype);
  }
  int64_t history_bytes() const { return states.history_bytes(opt.max_history + 1); }

  // The KV pools come last: with gpu_memory_utilization they take what the weights, states and
  // scratch leave of that share of the device, less a reserve for CUDA graphs and cuBLASLt
  // workspaces (made later) and, when drafts will be verified, the state history.
  void allocate_kv_pools();

  // ---- profiling (op_profiler.h)
  using Scope = OpProfiler::Scope;
  void collect_profile() { profiler.collect(); }

  // ---- one forward over a batch that fits the scratch buffers (step_plan.h, runner_step.cpp)
  using AttentionRun = cuda::AttentionRun;
  using Plan = StepPlan;
  // The attention kernels of this model, chosen once at start-up from the kernel plan
  // (opt.kernels) and the kernels' coverage of its head shape.
  bool prefill_tensor_core = true, decode_tensor_core = true;
  AttentionRun attention_run(int t0, bool prefill) const {
    return AttentionRun{t0, 0, prefill, prefill ? prefill_tensor_core : decode_tensor_core};
  }

  // Appends sequence i of a batch to the step metadata: its tokens at positions start.. (blocks
  // grown as needed), the output rows (hidden states of every token with all_rows or all_hidden,
  // logits of every token with all_rows; else the last token's), its state slot and block table.
  // A sequence too long or holding a token outside the vocabulary fails alone (SequenceError).
  // forward() checks every step before it runs any chunk of the batch, so no state has changed.
  void check_step(SequenceId id, int64_t start, std::span<const int32_t> tokens) const;
  void add_to_plan(Plan& p, int i, SequenceId id, Sequence& sq, int64_t start, std::span<const int32_t> tokens,
                   bool all_rows, bool all_hidden = false);

  // The pinned metadata is rewritten only after the step before has copied it (that step may still
  // be running: overlapped scheduling).
  void wait_uploads() { FATHOM_CUDA_CHECK(cudaEventSynchronize(meta_uploaded)); }

  // The metadata of one forward of `steps` (which fit the limits), uploaded; a plain decode batch
  // is padded to its graph bucket.
  Plan prepare(std::span<const ForwardStep> steps);

  bool uses_graphs() const { return opt.cuda_graphs && !opt.profile; }
  std::vector<int> graph_buckets() const { return cuda::graph_buckets(opt.max_seqs); }
  bool fits_graph(int B) const {
    return B <= T_max && B <= R_max && B * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
  }
  // A decode step of B padding rows only (what start-up captures), its metadata uploaded.
  Plan padding_plan(int B);

  // Rows S.. of a decode batch up to B: token 0 at position 0 of a scratch sequence (pad_slot's
  // state, pad_block's KV), whose outputs nobody reads.
  void pad_to(Plan& p, int B);

  void start_up_graphs();

  // Captures the graphs of every decode bucket (a step of padding rows only), so that serving
  // never stops to capture. Returns the buckets and the device memory the graphs took.
  std::pair<int, int64_t> capture_decode_graphs();

  // The step's metadata to the device: the block tables come last, so only the rows of the
  // step's S sequences travel (each row is max_seq_len / block_size wide, 16,384 entries at
  // 262,144 tokens).
  void upload_meta(int S);

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

  // A MoE layer's combine left to the next layer's input norm (combine_add_rms_norm): set by
  // moe_block when run_layers allows it (defer_combine: a layer other than the last, no
  // collective between), taken by the next decoder_layer. delta is not written meanwhile.
  bool defer_combine = false, combine_pending = false;
  MoeCombineRows pending_combine;
  // x += the layer output (delta, or the pending combine), then the input norm into xn.
  void add_input_norm(const DevLayer& l, int T);

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

  // Prefill-sized steps route with the split bf16 product; decode and verify stay exact fp32
  // (linear_f32: the GEMV, over 8-token chunks past kGemvMaxTokens, so a token's logits have the
  // same bits at every step size up to kSplitTokens).
  static bool router_split(const DevLayer& l, int T) { return T > kSplitTokens && l.router3.bf16; }
  static_assert(kGemvChunkedMaxTokens >= kSplitTokens, "decode-sized routing past the chunked GEMV would leave its bits");

  // How route() left a MoE layer's tokens: routed only, grouped for the packed experts too, or
  // routed and run through the experts in one launch (moe_decode_fused).
  enum class MoeRouting { Ungrouped, Grouped, FusedWithExperts };
  MoeRouting route(const DevLayer& l, int T);
  void moe_block(const DevLayer& l, const Plan& p);

  // Final norm and lm_head over the selected rows; argmax on the device (none with a null argmax_out).
  void head(const Plan& p) { head(p, w.final_norm, act.argmax.as<int32_t>()); }
  void head(const Plan& p, const float* norm, int32_t* argmax_out);

  void run(const Plan& p);
  // The step's launches through `cache`: replayed from a graph when the plan allows (decode and
  // verify shapes, graphs on, no profiling), else eagerly.
  template <class Body>
  void replay(GraphCache& cache, const Plan& p, Body&& body);
  void run_mtp_step(const Plan& p);
  // A greedy round's device work as one graph per (tokens, sequences, rows, chained): the chained
  // round's patch and state restore, the verify step, the MTP step reading the verify rows'
  // argmax and final hidden rows where they are, the outcome. No copies between them, so the
  // kernels' programmatic launches chain across the whole round.
  GraphCache round_graphs{/*capture_on_second_sight=*/true};
  // A sampled round's device work beyond a greedy one's (runner_mtp_round.cpp): its rows'
  // parameters are uploaded (row_params: the verify rows, then the draft rows where rows draw
  // drafts), with adjustments and token masks where it has them. Where no verify row is greedy
  // (no_argmax) the verify step's argmax is not taken, and where every row draws its draft
  // (all_draw) neither is the MTP step's: the sampler reads the rows itself. Only for rows it
  // stages (kSampleRowsStagedVocab): over a larger vocabulary the argmax saves the sampler a pass.
  struct SampledRound {
    bool draws = false, verifies = false, adjust = false, masks = false, logprobs = false;
    bool no_argmax = true, all_draw = true;
    int key() const {
      return 2 | (draws ? 4 : 0) | (verifies ? 8 : 0) | (adjust ? 16 : 0) | (masks ? 32 : 0) | (logprobs ? 64 : 0) |
             (no_argmax ? 128 : 0) | (all_draw && draws ? 256 : 0);
    }
  };
  void run_round(const Plan& p, bool chained, const SampledRound* sr = nullptr);
  void upload_round_rows(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                         std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks, LaunchedRound& lr,
                         SampledRound& sr);

  // MTP rows of each step sit at positions mtp_length.. of its sequence (the positions of the
  // hidden states they consume), in the MTP layer's own KV pool with the sequence's block table.
  // With inputs_on_device the steps' hidden rows and next tokens are not read (the caller copies
  // them into mtp_hidden and the token ids on the device after this returns).
  Plan prepare_mtp(std::span<const MtpStep> steps, bool inputs_on_device = false);
  // The MTP step over a verify step's rows at the same positions (a fused round: the MTP layer
  // was where the model was): that step's metadata as it is on the device, no upload and no wait
  // for one; the caller puts the token ids and hidden rows in place.
  Plan mtp_plan_on_verify(const Plan& verify) {
    Plan q = verify;
    q.graphable = verify.max_seq_tokens < kPrefillRunTokens;
    hist_step = false;
    return q;
  }
  Plan last_prepared;  // the last prepare()'s plan (its metadata on the device until the next upload)
  // After an MTP step has been launched: its hidden rows to the host (when `hidden` is given), a
  // wait for the step, and each sequence's MTP length advanced.
  void finish_mtp(std::span<const MtpStep> steps, const Plan& p, std::vector<float>* hidden) {
    if (hidden) {
      hidden->resize(size_t(p.R) * cfg.hidden_size);
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(hidden->data(), act.sel.data(), hidden->size() * 4, cudaMemcpyDeviceToHost, stream));
    }
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const MtpStep& st : steps) seq(st.seq).mtp_length += int64_t(st.next_tokens.size());
  }

  // u = fc([norm_e(embed(next)) | norm_h(hidden)]), one full-attention MoE layer, mtp.norm, lm_head:
  // next token ids, hidden rows and the drafts' argmax where given (default: dmeta.ids,
  // act.mtp_hidden, act.argmax, the places the draft path uploads to; a null `draft` takes none).
  void run_mtp(const Plan& p) { run_mtp(p, dmeta.ids, act.mtp_hidden.as<float>(), act.argmax.as<int32_t>()); }
  void run_mtp(const Plan& p, const int32_t* ids, const float* hidden, int32_t* draft);

  // Cuts steps into forwards that fit the step limits (step_plan.h).
  template <class Fn>
  void for_each_chunk(std::span<const ForwardStep> steps, Fn&& fn) {
    cuda::for_each_chunk(steps, ChunkLimits{T_max, R_max, opt.max_seqs}, std::forward<Fn>(fn));
  }
};

}  // namespace fathom::cuda
