// What the runtime (scheduler, speculative decoding, server) needs from an engine: sequences
// with their own cache/state, batched forward passes over ragged token lists, rollback to an
// earlier length (speculation), and the MTP draft layer. The CPU reference engine and the CUDA
// engine both implement it, so everything above this line runs on either.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kv_cache_dtype.h"
#include "core/row_sampling.h"
#include "io/model_config.h"

namespace fathom {

using SequenceId = int64_t;

// A step token the host does not know yet: the token the sequence's previous forward_sampled()
// step chose on the device (overlapped scheduling, on engines with supports_pending_tokens()).
inline constexpr int32_t kPendingToken = -1;

struct ForwardStep {
  SequenceId seq;
  std::span<const int32_t> tokens;  // appended at positions length(seq) ...
  bool all_rows = false;            // output every token's row, else only the last
  // Keep the linear-attention state after every token of this step so that
  // rollback() can return to any length inside it (verification of drafts).
  bool keep_history = false;
  // Output every token's hidden state (the MTP layer reads them) while logits follow all_rows:
  // a prefill chunk needs one row of logits but all its hidden states.
  bool all_hidden = false;
};

struct ForwardOutput {
  int64_t rows = 0;                       // logits rows: n per all_rows step, else 1
  std::vector<float> logits;              // [rows, vocab], host fp32
  std::vector<int64_t> row_begin;         // first logits row of each step
  std::vector<float> hidden;              // final post-norm hidden states: n rows per all_rows or
  std::vector<int64_t> hidden_row_begin;  // all_hidden step, else 1; first hidden row of each step
};

// forward() with each logits row's token chosen where the logits are (see core/row_sampling.h):
// only the choices, the logprobs asked for and (when wanted) the hidden states come back.
struct SampledOutput {
  int64_t rows = 0;                       // as ForwardOutput
  std::vector<int64_t> row_begin;
  std::vector<RowSample> samples;         // [rows]
  std::vector<int32_t> top_ids;           // [rows, kMaxTopLogprobs] when any row asks for logprobs
  std::vector<float> top_logprobs;
  std::vector<float> hidden;              // as ForwardOutput, when want_hidden
  std::vector<int64_t> hidden_row_begin;
  // The raw logits of the rows with RowSampling::keep_logits: kept_rows[i]'s row is
  // kept_logits[i * vocab, (i + 1) * vocab).
  std::vector<int64_t> kept_rows;
  std::vector<float> kept_logits;
  const float* kept_row_logits(int64_t row, int64_t vocab) const {
    for (size_t i = 0; i < kept_rows.size(); ++i)
      if (kept_rows[i] == row) return kept_logits.data() + int64_t(i) * vocab;
    return nullptr;
  }
};

// The argmax of each MTP row and its hidden state (the draft chain needs nothing else).
struct GreedyOutput {
  std::vector<int32_t> ids;               // [rows]
  std::vector<int64_t> row_begin;
  std::vector<float> hidden;              // [rows, hidden]
};

// A speculative round with the MTP draft in the same launch (forward_verify_draft): per row of
// the steps, the token chosen there (the main model's argmax, or by the row's sampling) and the
// MTP layer's argmax for the position after it.
struct VerifyDraftOutput {
  std::vector<int32_t> target;  // [rows] the token chosen at each row
  std::vector<int32_t> draft;   // [rows] the MTP layer's argmax, given row i's hidden and target[i]
  std::vector<int64_t> row_begin;
  // With sampling rows: each row's choice (accepted: the row's draft was), and the top logprobs
  // of rows that ask, as SampledOutput's.
  std::vector<RowSample> samples;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

struct MtpStep {
  SequenceId seq;
  std::span<const float> hidden;         // [n, hidden] post-norm hidden states
  std::span<const int32_t> next_tokens;  // [n] the token after each hidden's position
  bool all_rows = true;
};

// A problem with one sequence of a step (too long, a token outside the vocabulary), raised by
// forward() before it changes any sequence's state: the caller may drop that sequence and run
// the others again.
class SequenceError : public Error {
 public:
  SequenceError(SequenceId seq, const std::string& what) : Error(what), seq_(seq) {}
  SequenceId seq() const { return seq_; }

 private:
  SequenceId seq_;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::string device_name() const = 0;
  virtual bool has_mtp() const = 0;

  virtual SequenceId add_sequence() = 0;
  virtual void remove_sequence(SequenceId seq) = 0;
  virtual int64_t length(SequenceId seq) const = 0;      // tokens consumed by the main model
  virtual int64_t mtp_length(SequenceId seq) const = 0;  // positions consumed by the MTP layer

  virtual ForwardOutput forward(std::span<const ForwardStep> steps) = 0;
  // Returns the sequence to `new_length` tokens; lengths inside the last keep_history step (or
  // the current length) are allowed. Also truncates the MTP cache to at most new_length.
  virtual void rollback(SequenceId seq, int64_t new_length) = 0;
  virtual ForwardOutput mtp_forward(std::span<const MtpStep> steps) = 0;
  virtual void mtp_rollback(SequenceId seq, int64_t new_length) = 0;

  // Engines that choose tokens on the device say so and implement forward_sampled(): `rows` has
  // one entry per logits row forward() would return (in its order), pointing into `adjust` and,
  // with mask_row >= 0, into `masks` (mask_words(vocab) words a row).
  virtual bool samples_on_device() const { return false; }
  // Whether sampled steps return the raw logits of rows with RowSampling::keep_logits
  // (SampledOutput::kept_logits): the prefix cache's prompt ends under device sampling.
  virtual bool returns_kept_logits() const { return false; }
  virtual SampledOutput forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                        std::span<const LogitAdjustment> adjust, bool want_hidden,
                                        std::span<const uint32_t> masks = {}) {
    (void)steps, (void)rows, (void)adjust, (void)want_hidden, (void)masks;
    fail("forward_sampled: ", device_name(), " does not sample on the device");
  }
  // forward_sampled() in two halves, for scheduling the next step while this one runs: launch
  // returns once the step is queued (sequence lengths already advanced), finish waits for the
  // oldest launched step and returns its results. A second step may be launched before the first
  // is finished (not more), and may use kPendingToken for a sequence whose last row the first
  // samples.
  // Token masks (structured output) that depend on the step in flight can come later: with
  // defer_masks the forward is queued and its sampler waits for supply_masks(), whose table the
  // rows' mask_row index. For steps of up to deferred_mask_tokens() tokens (0: not supported).
  virtual bool supports_pending_tokens() const { return false; }
  virtual void launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                              std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks = {},
                              bool defer_masks = false) {
    (void)steps, (void)rows, (void)adjust, (void)masks, (void)defer_masks;
    fail("launch_sampled: ", device_name(), " cannot overlap steps");
  }
  virtual int64_t deferred_mask_tokens() const { return 0; }
  virtual void supply_masks(std::span<const uint32_t> masks) {
    (void)masks;
    fail("supply_masks: ", device_name(), " cannot defer token masks");
  }
  virtual SampledOutput finish_sampled() { fail("finish_sampled: ", device_name(), " cannot overlap steps"); }
  // mtp_forward() reduced to argmax ids and hidden states; engines override it to skip the
  // logits copy.
  virtual GreedyOutput mtp_forward_greedy(std::span<const MtpStep> steps) {
    ForwardOutput fo = mtp_forward(steps);
    const int64_t V = config().vocab_size;
    GreedyOutput g;
    g.row_begin = fo.row_begin;
    g.hidden = std::move(fo.hidden);
    for (int64_t r = 0; r < fo.rows; ++r) {  // ties to the lowest id, as torch.argmax
      const float* row = fo.logits.data() + r * V;
      int64_t best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (row[i] > row[best]) best = i;
      g.ids.push_back(int32_t(best));
    }
    return g;
  }

  // One MTP round in one launch, for engines that can (supports_fused_mtp_round): each step
  // (all_rows and keep_history; its sequence's MTP layer caught up, mtp_length == length) runs
  // through the main model, each row's token is chosen (the argmax when `rows` is empty, else by
  // its RowSampling, as forward_sampled: drafts verified by rejection sampling, adjustments,
  // masks, logprobs), then the MTP layer runs over the same rows, row i's hidden state with the
  // token chosen there as its next token. Both lengths advance by every token: the caller rolls
  // both back to what it accepted. Saves the draft step's own host round trip.
  // Engines without a fused launch run the same round as a forward, the CPU row sampler
  // (kernels/cpu/row_sampler.h) and an MTP forward (model_runner.cpp).
  virtual bool supports_fused_mtp_round() const { return has_mtp(); }
  // Whether fused rounds draw sampled rows' drafts from the MTP layer's distribution and verify
  // them against it (RowSampling::draw_draft, kDraftQKept), else drafts are the MTP argmax.
  virtual bool draws_sampled_drafts() const { return false; }
  virtual VerifyDraftOutput forward_verify_draft(std::span<const ForwardStep> steps,
                                                 std::span<const RowSampling> rows = {},
                                                 std::span<const LogitAdjustment> adjust = {},
                                                 std::span<const uint32_t> masks = {});

  // Chained rounds (issue 34): forward_verify_draft() in two halves, so that round N + 1 is
  // queued before round N is read. launch_verify_draft returns once the round is queued;
  // finish_verify_draft waits for the oldest launched round and returns its output. At most two
  // rounds in flight, and no other launch meanwhile. A step whose two tokens are both
  // kPendingToken continues its sequence's round in flight, whose outcome the runner takes where
  // it is: a = the drafts that round accepted (greedy: target row by row equal to the token fed
  // after it; sampled: RowSample::accepted), the sequence (and its MTP layer) back to its length
  // before that round + 1 + a, then [target[a], draft[a]] fed; that step's sampling rows draw
  // a further (RowSampling::draw + a), and a row with draft kDraftFromRound verifies draft[a].
  // The caller rolls back nothing of a round that a chained step continues.
  virtual bool supports_chained_rounds() const { return false; }
  // Whether chained rounds may have sampling rows (else only greedy rounds launch this way).
  virtual bool chains_sampled_rounds() const { return supports_chained_rounds(); }
  virtual void launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows = {},
                                   std::span<const LogitAdjustment> adjust = {},
                                   std::span<const uint32_t> masks = {}) {
    (void)steps, (void)rows, (void)adjust, (void)masks;
    fail("launch_verify_draft: ", device_name(), " cannot chain MTP rounds");
  }
  virtual VerifyDraftOutput finish_verify_draft() {
    fail("finish_verify_draft: ", device_name(), " cannot chain MTP rounds");
  }

  // Prefix caching (runtime/prefix_cache.h): a snapshot is a copy of a sequence's whole state at
  // its current length (every layer's KV, the linear-attention states, the MTP layer's KV), which
  // later sequences start from. Copies, not shared blocks: a Gated DeltaNet state cannot be cut
  // back to a shorter prefix, so a snapshot is taken where a prefix may be reused.
  virtual bool supports_snapshots() const { return false; }
  // The snapshot's id, or 0 when the room the engine set aside for snapshots is full.
  virtual int64_t save_snapshot(SequenceId seq) {
    (void)seq;
    fail("save_snapshot: ", device_name(), " has no prefix snapshots");
  }
  // A new sequence holding the snapshot's state (its length and MTP length are the snapshot's).
  virtual SequenceId add_sequence_from(int64_t snapshot) {
    (void)snapshot;
    fail("add_sequence_from: ", device_name(), " has no prefix snapshots");
  }
  virtual void drop_snapshot(int64_t snapshot) { (void)snapshot; }
  virtual int64_t snapshot_bytes(int64_t snapshot) const {
    (void)snapshot;
    return 0;
  }
  // The host-memory tier (--prefix-cache-host-gb): a snapshot moved to host memory when the
  // device's room evicts it, and back on a hit. Both moves consume the snapshot they are given
  // (even while the copy is still in flight: engines order it before any later use) and return
  // the new one's id; 0: no room there (the given snapshot is left as it was).
  virtual bool supports_host_snapshots() const { return false; }
  // The most host memory the tier may take (what the engine's host cache holds); engines that
  // reserve host memory for it size that from this.
  virtual void set_host_snapshot_budget(int64_t bytes) { (void)bytes; }
  virtual int64_t move_snapshot_to_host(int64_t snapshot) {
    (void)snapshot;
    fail("move_snapshot_to_host: ", device_name(), " has no host tier for snapshots");
  }
  virtual int64_t move_snapshot_from_host(int64_t host_snapshot) {
    (void)host_snapshot;
    fail("move_snapshot_from_host: ", device_name(), " has no host tier for snapshots");
  }
  virtual void drop_host_snapshot(int64_t host_snapshot) { (void)host_snapshot; }
  // The room set aside for snapshots: how many at once, and tokens of KV over all (0: no bound).
  struct SnapshotRoom {
    int64_t snapshots = 0, tokens = 0;
  };
  virtual SnapshotRoom snapshot_room() const { return {}; }

  // What the engine was sized for (0: no fixed bound, as for the CPU engine, whose caches grow):
  // tokens of KV cache over all sequences, the longest sequence, sequences held at once. The
  // serving engine takes its limits from these, so that it never schedules what cannot run.
  virtual int64_t kv_capacity_tokens() const { return 0; }
  virtual int64_t max_sequence_length() const { return 0; }
  virtual int max_sequences() const { return 0; }
  // The KV cache's element type (--kv-cache-dtype as resolved for this checkpoint).
  virtual KvCacheDtype kv_cache_dtype() const { return KvCacheDtype::Bf16; }
};

// How an engine splits the model over ranks (docs/design.md, "Splitting over GPUs").
// The kernel-backend flags (model/cuda/backend_tuning.h): the policy ("verified-fastest" or
// "fixed"), candidates pinned with the peers' flag names, whether the tuning cache may answer.
struct BackendOptions {
  std::string policy = "verified-fastest";
  std::string moe_runner_backend;  // d<i> / p<i>
  std::string attention_backend;   // tensor-core / cuda-core
  std::string fp4_gemm_backend;    // gemv / dequant-cublaslt
  std::string dense_gemm_backend;  // skinny / skinny-wgmma / cublaslt (bf16 products of 6 to 64 tokens)
  bool cache = true;
  // Speculative decoding is on: decode-side kernels keep a token's bits the same in verify steps
  // of any size (else each step size gets its fastest kernel).
  bool speculative = false;
};

struct TensorParallelism {
  int size = 1;                            // --tensor-parallel-size
  bool expert_parallel = false;            // routed experts whole per rank instead of split by columns
  bool force_nccl = false;                 // CUDA: the tensor-parallel path (NCCL collectives) even on one GPU
  bool disable_custom_all_reduce = false;  // CUDA, N > 1: NCCL for every message (no one-shot peer collectives)
};

// How to build an engine beyond the checkpoint path (flag names as vLLM's).
struct EngineOptions {
  std::string load_format = "auto";  // "dummy": random weights at the config's shapes (path: config.json or folder)
  int num_layers = 0;                // > 0: keep the layer pattern, cut depth to this many layers (dummy only)
  int max_seqs = 0;                  // sequences held at once (0: engine default)
  int64_t max_model_len = 0;         // longest sequence (0: engine default)
  int max_batched_tokens = 0;        // tokens in one forward (0: engine default)
  int speculative_tokens = 0;        // drafts verified per step (K): linear-attention state is
                                     // kept for K + 1 positions per sequence
  bool sampled_drafts = false;       // --speculative-sampled-drafts: the drafts' distributions are
                                     // kept on the device (CUDA: set aside before the KV cache)
  int64_t num_kv_blocks = 0;         // KV blocks of 16 tokens (0: sized from device memory)
  double gpu_memory_utilization = 0.9;  // share of the device's memory the engine may use
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto, bf16, fp8, fp8_e4m3
  TensorParallelism parallel;
  // CUDA kernel backends (model/cuda/backend_tuning.h), chosen before the GPU is touched; an
  // empty policy: the fixed rules, unverified.
  // Prefix-cache snapshots (CUDA: memory set aside from the KV budget; 0: none).
  int64_t prefix_cache_mb = 0;
  BackendOptions backends = [] {
    BackendOptions b;
    b.policy.clear();
    return b;
  }();
};

// A fused MTP round on the host (ModelRunner::forward_verify_draft of engines without a launch of
// their own): m's forward, each row's token by the CPU row sampler, then m's MTP forward. With
// draft distributions: rows' draft_q index `q_in` ([n, vocab]); rows with draw_draft have their
// MTP draft drawn from the MTP layer's distribution (RowSampling::q_out), which goes to row i of
// `q_drawn` ([rows, vocab], resized).
VerifyDraftOutput verify_draft_on_host(ModelRunner& m, std::span<const ForwardStep> steps,
                                       std::span<const RowSampling> rows, std::span<const LogitAdjustment> adjust,
                                       std::span<const uint32_t> masks, const float* q_in = nullptr,
                                       std::vector<float>* q_drawn = nullptr);

// "auto" becomes "cuda" when this build has the CUDA engine and a GPU is visible, else "cpu"
// (and says which on stderr); other names are returned as they are.
std::string resolve_device(const std::string& device);

// Opens a checkpoint on "cpu" (the reference engine), "cuda" (when built with CUDA) or "auto".
// Defined in src/runtime/engine_factory.cpp, the layer that knows every engine.
std::unique_ptr<ModelRunner> open_model(const std::string& path, const std::string& device, bool with_mtp,
                                        const EngineOptions& options = {});

}  // namespace fathom
