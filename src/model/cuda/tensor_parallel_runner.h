// The CUDA engine split over the GPUs of this process (tensor parallelism, issue 15): one
// CudaRunner per GPU, each holding its slice of the weights and driven by a thread of its own.
// A thread per rank because CUDA calls act on the calling thread's current device, and because a
// collective waits until every rank has enqueued it: the ranks' host code has to run at once.
// Every call runs on all ranks and returns rank 0's result; the lm_head gather leaves every rank
// the whole logits, so all ranks sample the same tokens and their sequences stay in step.
// An error in one rank aborts the group (NCCL communicators included), so no rank is left
// waiting in a collective, and is rethrown to the caller.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "model/cuda/cuda_runner.h"

namespace fathom::cuda {

// How the ranks talk: NCCL; one-shot collectives over peer memory (kernels/cuda/
// peer_communicator.h) for every message; both, one-shot for messages of up to
// one_shot_max_bytes (vLLM's custom all-reduce beside NCCL); or, for one rank, nothing at all.
enum class Collectives { None, Nccl, OneShot, Auto };

struct ParallelGroup {
  int size = 1;
  std::vector<int> devices;  // rank -> GPU (default 0..size-1); tests put two ranks on one GPU
  Collectives collectives = Collectives::Auto;
  bool expert_parallel = false;  // routed experts whole per rank (else split by columns)
  int64_t one_shot_max_bytes = int64_t(1) << 20;  // Auto: a batch-64 decode step's hidden states
};

// The group the flags ask for: NCCL over one GPU with --force-nccl; one-shot collectives beside
// NCCL over several, unless --disable-custom-all-reduce.
inline ParallelGroup parallel_group(const TensorParallelism& p) {
  ParallelGroup g;
  g.size = p.size;
  g.expert_parallel = p.expert_parallel;
  g.collectives = p.size == 1 ? (p.force_nccl ? Collectives::Nccl : Collectives::None)
                  : p.disable_custom_all_reduce ? Collectives::Nccl
                                                : Collectives::Auto;
  return g;
}

class TensorParallelRunner final : public ModelRunner {
 public:
  // group.size ranks joined by group.collectives. One rank with collectives still runs every
  // collective (over one rank); one rank with Collectives::None is the plain engine. The
  // options' split, device and communicator are set per rank here.
  static std::unique_ptr<TensorParallelRunner> from_checkpoint(const std::string& dir, const CudaRunnerOptions& opt,
                                                               const ParallelGroup& group);
  static std::unique_ptr<TensorParallelRunner> dummy(const ModelConfig& cfg, const CudaRunnerOptions& opt,
                                                     const ParallelGroup& group, bool nvfp4_experts, uint64_t seed);
  ~TensorParallelRunner() override;

  int size() const { return int(ranks_.size()); }
  CudaRunner& rank(int r) { return *ranks_[size_t(r)]; }
  // fn(r) on every rank's thread at once; the first error is rethrown after all have stopped.
  void on_all_ranks(const std::function<void(int)>& fn);

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  std::string device_name() const override;
  bool has_mtp() const override { return ranks_[0]->has_mtp(); }
  SequenceId add_sequence() override;
  void remove_sequence(SequenceId seq) override;
  int64_t length(SequenceId seq) const override { return ranks_[0]->length(seq); }
  int64_t mtp_length(SequenceId seq) const override { return ranks_[0]->mtp_length(seq); }
  ForwardOutput forward(std::span<const ForwardStep> steps) override;
  void rollback(SequenceId seq, int64_t new_length) override;
  ForwardOutput mtp_forward(std::span<const MtpStep> steps) override;
  void mtp_rollback(SequenceId seq, int64_t new_length) override;
  bool samples_on_device() const override;  // as CudaRunner's
  SampledOutput forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                std::span<const LogitAdjustment> adjust, bool want_hidden,
                                std::span<const uint32_t> masks = {}) override;
  GreedyOutput mtp_forward_greedy(std::span<const MtpStep> steps) override;
  bool supports_pending_tokens() const override { return true; }
  void launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                      std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks = {},
                      bool defer_masks = false) override;
  int64_t deferred_mask_tokens() const override;
  void supply_masks(std::span<const uint32_t> masks) override;
  SampledOutput finish_sampled() override;
  // Prefix snapshots (issue 37): each rank copies its slice of the state; every call reaches all
  // ranks, so their snapshot ids agree, and a snapshot's bytes are all ranks' together.
  bool supports_snapshots() const override { return ranks_[0]->supports_snapshots(); }
  int64_t save_snapshot(SequenceId seq) override;
  SequenceId add_sequence_from(int64_t snapshot) override;
  void drop_snapshot(int64_t snapshot) override;
  int64_t snapshot_bytes(int64_t snapshot) const override;
  SnapshotRoom snapshot_room() const override { return ranks_[0]->snapshot_room(); }
  // The host tier: each rank moves its slice (the budget is the ranks' together).
  bool supports_host_snapshots() const override { return ranks_[0]->supports_host_snapshots(); }
  void set_host_snapshot_budget(int64_t bytes) override;
  int64_t move_snapshot_to_host(int64_t snapshot) override;
  int64_t move_snapshot_from_host(int64_t host_snapshot) override;
  void drop_host_snapshot(int64_t host_snapshot) override;
  int64_t kv_capacity_tokens() const override;
  int64_t max_sequence_length() const override;
  int max_sequences() const override { return ranks_[0]->max_sequences(); }
  KvCacheDtype kv_cache_dtype() const override { return ranks_[0]->kv_cache_dtype(); }

  // CudaRunner's benchmark methods on every rank (results and footprint: rank 0's).
  std::vector<int32_t> forward_argmax(std::span<const ForwardStep> steps);
  std::vector<int32_t> mtp_forward_argmax(std::span<const MtpStep> steps);
  void fill_context_for_benchmark(SequenceId seq, int64_t length);
  CudaRunner::Footprint footprint() const { return ranks_[0]->footprint(); }
  const OpProfile& profile() const { return ranks_[0]->profile(); }
  void reset_profile();
  void set_profiling(bool on);
  void synchronize();

 private:
  // Starts the rank threads and the communicators; `largest_floats`: the largest message the
  // engine sends (sizes the one-shot buffers when every message takes them).
  TensorParallelRunner(const ParallelGroup& group, size_t largest_floats);
  // Makes rank r's runner on its thread (opt completed per rank).
  void open(const CudaRunnerOptions& opt,
            const std::function<std::unique_ptr<CudaRunner>(const CudaRunnerOptions&, int rank)>& make);
  // rank 0's result of fn(rank r's runner) run on every rank.
  template <class R>
  R on_all(const std::function<R(CudaRunner&)>& fn);
  // fn's answer on every rank, checked equal (ids handed out in step on every rank).
  int64_t agreed(const std::function<int64_t(CudaRunner&)>& fn, const char* what);
  void worker(int r);
  // fn(r), keeping its error; any error but a SequenceError aborts the group.
  void run_rank(const std::function<void(int)>& fn, int r);

  std::vector<int> devices_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<CudaRunner>> ranks_;
  // Rank threads and the job they run (one at a time).
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(int)> job_;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::once_flag abort_once_;
};

}  // namespace fathom::cuda
