// The CUDA engine: the same model as the CPU reference (src/model/hybrid_model.cpp), layer by
// layer, over the operators of src/kernels/cuda. Weights live on the device in bf16 or NVFP4;
// the KV cache is paged (block tables per sequence); Gated DeltaNet states live in a pool of
// slots. Decode steps are padded to a few batch-size buckets, each captured once as a CUDA graph
// and replayed.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "io/model_config.h"
#include "kernels/cuda/kernel_plan.h"
#include "model/model_runner.h"
#include "model/model_weights.h"
#include "model/tensor_split.h"

namespace fathom::cuda {

// GPUs this process can use (0 when the driver or device is missing).
int visible_device_count();

struct CudaRunnerOptions {
  int max_seqs = 16;               // linear-attention state slots
  int max_tokens_per_step = 2048;  // tokens in one forward (longer steps are split)
  int max_rows_per_step = 256;     // output rows (logits) in one forward
  int64_t kv_cache_tokens = 16384; // paged KV capacity, tokens over all sequences
  int max_seq_len = 8192;          // block-table width
  int block_size = 16;
  // The KV pools' element type (--kv-cache-dtype, resolved): bf16, or E4M3 with each layer's
  // k_scale / v_scale (twice the tokens in the same memory).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::Bf16;
  bool cuda_graphs = true;         // capture/replay decode steps
  bool profile = false;            // per-op CUDA-event timings (disables graphs)
  bool load_mtp = false;           // load the checkpoint's MTP layer (speculative decoding)
  // Dummy weights only: attention, DeltaNet and shared-expert projections in FP8 W8A8 per tensor,
  // as the NVFP4-V2 release stores them (else bf16).
  bool dummy_fp8_dense = false;
  bool dummy_fp8_experts = false;  // dummy weights only: routed experts in FP8 (Qwen's FP8 releases)
  // W8A8 FP8 linears quantize their activations as the checkpoint says (the default); off, they
  // run weight-only (tests compare with the CPU engine's weight-only run).
  bool fp8_activation_quantization = true;
  int max_history = 8;             // tokens of a keep_history step (draft verification)
  // Load through host weights (load_model_weights) instead of streaming the shards to the device:
  // the older path, which needs the whole model in host memory; kept to check the streamed one.
  bool host_weights = false;
  // > 0: the KV pools take this share of the device's memory, less what weights, states and
  // scratch use (vLLM's --gpu-memory-utilization); kv_cache_tokens is then ignored.
  double gpu_memory_utilization = 0;
  bool reserve_history = false;    // leave room for the state history of draft verification
  // Fused rounds will draw sampled drafts: their distributions (SamplingBuffers::q_drawn for two
  // rows a sequence, q_kept a state slot) are allocated before the KV cache is sized.
  bool reserve_sampled_drafts = false;
  bool capture_graphs_at_start = false;  // capture every decode bucket's graph when the engine opens
  // Prefix-cache snapshots (runtime/prefix_cache.h): this many, holding up to snapshot_tokens of
  // KV in all, in memory set aside from the KV budget (0: no snapshots).
  int snapshot_slots = 0;
  int64_t snapshot_tokens = 0;
  // Tensor parallelism (issue 15): this runner is rank split.rank of split.size on GPU `device`
  // and holds that slice of the weights (model/tensor_split.h); partial sums go through
  // `communicator` (an NcclCommunicator on `device`, not owned). With a communicator and a whole
  // split every collective still runs, over one rank: the parallel path's cost on one GPU.
  int device = 0;
  TensorSplit split;                     // size 1: the whole model
  Communicator* communicator = nullptr;
  // The kernels of the ops with candidates (kernel_plan.h), chosen at start-up by the backend
  // registry (backend_tuning.h); the fixed rules by default.
  KernelPlan kernels;
};

struct OpProfile {
  std::map<std::string, double> ms;  // accumulated milliseconds per op group
  std::map<std::string, int64_t> calls;
};

class CudaRunner final : public ModelRunner {
 public:
  // Streams a checkpoint's weights to the device as stored (NVFP4 kept as NVFP4).
  static std::unique_ptr<CudaRunner> from_checkpoint(const std::string& dir, const CudaRunnerOptions& opt);
  // Random weights at the config's shapes, made on the device (`--load-format dummy`). Routed
  // experts are NVFP4 when `nvfp4_experts`, like the NVFP4 releases.
  static std::unique_ptr<CudaRunner> dummy(const ModelConfig& cfg, const CudaRunnerOptions& opt, bool nvfp4_experts,
                                           uint64_t seed);
  ~CudaRunner() override;

  const ModelConfig& config() const override;
  std::string device_name() const override;
  bool has_mtp() const override;
  SequenceId add_sequence() override;
  void remove_sequence(SequenceId seq) override;
  // Prefix snapshots (runner_snapshots.cpp): copies into memory set aside for them; save returns
  // 0 when that is full (the caller evicts and tries again).
  bool supports_snapshots() const override;
  int64_t save_snapshot(SequenceId seq) override;
  SequenceId add_sequence_from(int64_t snapshot) override;
  void drop_snapshot(int64_t snapshot) override;
  int64_t snapshot_bytes(int64_t snapshot) const override;
  SnapshotRoom snapshot_room() const override;
  // The host tier: snapshots copied to and from pinned host memory on a stream of their own
  // (runner_snapshots.cpp), beside the steps.
  bool supports_host_snapshots() const override { return supports_snapshots(); }
  void set_host_snapshot_budget(int64_t bytes) override;
  int64_t move_snapshot_to_host(int64_t snapshot) override;
  int64_t move_snapshot_from_host(int64_t host_snapshot) override;
  void drop_host_snapshot(int64_t host_snapshot) override;
  int64_t length(SequenceId seq) const override;
  int64_t mtp_length(SequenceId seq) const override;
  ForwardOutput forward(std::span<const ForwardStep> steps) override;
  void rollback(SequenceId seq, int64_t new_length) override;
  ForwardOutput mtp_forward(std::span<const MtpStep> steps) override;
  void mtp_rollback(SequenceId seq, int64_t new_length) override;
  bool samples_on_device() const override;  // runner_sampling.cpp
  SampledOutput forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                std::span<const LogitAdjustment> adjust, bool want_hidden,
                                std::span<const uint32_t> masks = {}) override;
  GreedyOutput mtp_forward_greedy(std::span<const MtpStep> steps) override;
  bool supports_pending_tokens() const override { return true; }
  void launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                      std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks = {},
                      bool defer_masks = false) override;
  int64_t deferred_mask_tokens() const override;
  // Prompt ends under device sampling (issue 37): kept rows are always returned; the engine is told
  // so (and snapshots prompt ends) unless FATHOM_DEVICE_PROMPT_ENDS=0.
  bool returns_kept_logits() const override;
  bool supports_fused_mtp_round() const override;
  // Sampled drafts: drawn on the device from the MTP layer's distribution, its q kept per state
  // slot until the next round verifies against it (runner_mtp_round.cpp).
  bool draws_sampled_drafts() const override { return supports_fused_mtp_round(); }
  VerifyDraftOutput forward_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows = {},
                                         std::span<const LogitAdjustment> adjust = {},
                                         std::span<const uint32_t> masks = {}) override;
  // Chained rounds, greedy and sampled: the round's outcome stays on the device per state slot and
  // a chained launch takes it from there (runner_mtp_round.cpp).
  bool supports_chained_rounds() const override;
  void launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows = {},
                           std::span<const LogitAdjustment> adjust = {},
                           std::span<const uint32_t> masks = {}) override;
  VerifyDraftOutput finish_verify_draft() override;  // runner_mtp_round.cpp
  void supply_masks(std::span<const uint32_t> masks) override;
  SampledOutput finish_sampled() override;
  int64_t kv_capacity_tokens() const override;
  int64_t max_sequence_length() const override;
  int max_sequences() const override;
  KvCacheDtype kv_cache_dtype() const override;

  // Greedy fast path: the argmax of each output row (each step's last row, or all of its rows with
  // all_rows) without copying logits; the batch must fit one engine step.
  std::vector<int32_t> forward_argmax(std::span<const ForwardStep> steps);
  std::vector<int32_t> mtp_forward_argmax(std::span<const MtpStep> steps);
  // Benchmarks: pretend `seq` already holds `length` tokens of context (KV blocks allocated,
  // contents arbitrary), so decode can be timed at a context length without a long prefill.
  void fill_context_for_benchmark(SequenceId seq, int64_t length);

  struct Footprint {
    int64_t weight_bytes = 0, expert_bytes = 0, dense_bytes = 0, kv_bytes = 0, state_bytes = 0;
    int64_t draft_bytes = 0;  // sampled drafts' distributions set aside at start (reserve_sampled_drafts)
  };
  Footprint footprint() const;
  const OpProfile& profile() const;
  void reset_profile();
  // Per-op CUDA-event timing (graphs are bypassed while it is on).
  void set_profiling(bool on);
  // Waits for everything queued on the engine's stream (benchmarks timing asynchronous work).
  void synchronize();

 private:
  struct Impl;
  explicit CudaRunner(std::unique_ptr<Impl> impl);
  // launch_sampled(), also returning hidden states (forward_sampled for speculative decoding).
  void launch(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
              std::span<const LogitAdjustment> adjust, bool want_hidden, std::span<const uint32_t> masks = {},
              bool defer_masks = false);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom::cuda
