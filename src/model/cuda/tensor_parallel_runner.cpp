#include "model/cuda/tensor_parallel_runner.h"

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mixed_communicator.h"

namespace fathom::cuda {

TensorParallelRunner::TensorParallelRunner(const ParallelGroup& group, size_t largest_floats)
    : devices_(group.devices), ranks_(size_t(group.size)), errors_(size_t(group.size)) {
  const int size = group.size;
  FATHOM_CHECK(size >= 1, "--tensor-parallel-size must be at least 1, got ", size);
  FATHOM_CHECK(size == 1 || group.collectives != Collectives::None, "ranks of a split model need collectives");
  if (devices_.empty())
    for (int r = 0; r < size; ++r) devices_.push_back(r);
  FATHOM_CHECK(int(devices_.size()) == size, "a group of ", size, " ranks needs as many devices");
  const int visible = visible_device_count();
  for (int d : devices_)
    FATHOM_CHECK(d >= 0 && d < visible, "--tensor-parallel-size ", size, " needs GPU ", d, "; ", visible, " visible");
  std::string how;
  switch (group.collectives) {
    case Collectives::None:
      break;
    case Collectives::Nccl:
      for (auto& c : NcclCommunicator::create_group(devices_)) comms_.push_back(std::move(c));
      how = "NCCL " + NcclCommunicator::version();
      break;
    case Collectives::OneShot:
      for (auto& c : PeerCommunicator::create_group(devices_, largest_floats)) comms_.push_back(std::move(c));
      how = "one-shot peer collectives";
      break;
    case Collectives::Auto: {
      auto nccl = NcclCommunicator::create_group(devices_);
      auto peer = PeerCommunicator::create_group(devices_, size_t(group.one_shot_max_bytes) / sizeof(float));
      for (int r = 0; r < size; ++r)
        comms_.push_back(std::make_unique<MixedCommunicator>(std::move(nccl[size_t(r)]), std::move(peer[size_t(r)])));
      how = "one-shot peer collectives up to " + std::to_string(group.one_shot_max_bytes >> 10) + " KB, NCCL " +
            NcclCommunicator::version() + " above";
      break;
    }
  }
  if (!how.empty())
    std::fprintf(stderr, "fathom: tensor parallel over %d rank%s, %s (NVLink multicast off)\n", size,
                 size > 1 ? "s" : "", how.c_str());
  for (int r = 1; r < size; ++r) threads_.emplace_back(&TensorParallelRunner::worker, this, r);
}

TensorParallelRunner::~TensorParallelRunner() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  // Runners before communicators; each communicator aborts rather than waits (its header).
  for (int r = 0; r < size(); ++r) {
    cudaSetDevice(devices_[size_t(r)]);
    ranks_[size_t(r)].reset();
  }
}

bool TensorParallelRunner::samples_on_device() const { return ranks_.front()->samples_on_device(); }

void TensorParallelRunner::worker(int r) {
  cudaSetDevice(devices_[size_t(r)]);
  uint64_t seen = 0;
  for (;;) {
    std::function<void(int)> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    run_rank(job, r);
    std::lock_guard<std::mutex> l(mu_);
    if (--running_ == 0) cv_.notify_all();
  }
}

void TensorParallelRunner::run_rank(const std::function<void(int)>& fn, int r) {
  try {
    fn(r);
  } catch (const SequenceError&) {
    // A sequence's own problem, found by every rank alike before any collective: the group
    // stays usable and the caller drops that sequence.
    errors_[size_t(r)] = std::current_exception();
  } catch (...) {
    errors_[size_t(r)] = std::current_exception();
    std::string what = "an unknown error";
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    // Every rank's communicator, once: a peer waiting in a collective this rank will never join
    // is released (NCCL's abort ends its pending operations) instead of hanging.
    const std::string why = "rank " + std::to_string(r) + " failed: " + what;
    std::call_once(abort_once_, [&] {
      for (auto& c : comms_) c->abort(why);
    });
  }
}

void TensorParallelRunner::on_all_ranks(const std::function<void(int)>& fn) {
  if (size() == 1) {  // the calling thread
    FATHOM_CUDA_CHECK(cudaSetDevice(devices_[0]));
    return fn(0);
  }
  std::fill(errors_.begin(), errors_.end(), nullptr);
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = fn;
    running_ = size() - 1;
    ++generation_;
  }
  cv_.notify_all();
  FATHOM_CUDA_CHECK(cudaSetDevice(devices_[0]));  // rank 0 runs on the calling thread
  run_rank(fn, 0);
  {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return running_ == 0; });
  }
  rethrow_root_cause(errors_);
}

template <class R>
R TensorParallelRunner::on_all(const std::function<R(CudaRunner&)>& fn) {
  R out{};
  on_all_ranks([&](int r) {
    R mine = fn(*ranks_[size_t(r)]);
    if (r == 0) out = std::move(mine);
  });
  return out;
}

void TensorParallelRunner::open(
    const CudaRunnerOptions& opt, const std::function<std::unique_ptr<CudaRunner>(const CudaRunnerOptions&, int)>& make) {
  on_all_ranks([&](int r) {
    CudaRunnerOptions o = opt;
    o.device = devices_[size_t(r)];
    o.communicator = comms_.empty() ? nullptr : comms_[size_t(r)].get();
    ranks_[size_t(r)] = make(o, r);
  });
}

namespace {

// The largest message a rank sends: a step's hidden states, or its share of the logits.
size_t largest_message(const ModelConfig& cfg, const CudaRunnerOptions& opt, int size) {
  const size_t hidden = size_t(opt.max_tokens_per_step) * cfg.hidden_size;
  const size_t logits = size_t(std::max(opt.max_rows_per_step, opt.max_seqs)) * ((cfg.vocab_size + size - 1) / size);
  return std::max(hidden, logits);
}

}  // namespace

std::unique_ptr<TensorParallelRunner> TensorParallelRunner::from_checkpoint(const std::string& dir,
                                                                            const CudaRunnerOptions& opt,
                                                                            const ParallelGroup& group) {
  const ModelConfig cfg = ModelConfig::load(dir);
  std::unique_ptr<TensorParallelRunner> t(new TensorParallelRunner(group, largest_message(cfg, opt, group.size)));
  t->open(opt, [&](const CudaRunnerOptions& o, int rank) {
    CudaRunnerOptions rank_opt = o;
    rank_opt.split = TensorSplit::make(cfg, rank, group.size, group.expert_parallel);
    return CudaRunner::from_checkpoint(dir, rank_opt);
  });
  return t;
}

std::unique_ptr<TensorParallelRunner> TensorParallelRunner::dummy(const ModelConfig& cfg, const CudaRunnerOptions& opt,
                                                                  const ParallelGroup& group, bool nvfp4_experts,
                                                                  uint64_t seed) {
  std::unique_ptr<TensorParallelRunner> t(new TensorParallelRunner(group, largest_message(cfg, opt, group.size)));
  t->open(opt, [&](const CudaRunnerOptions& o, int rank) {
    CudaRunnerOptions rank_opt = o;
    rank_opt.split = TensorSplit::make(cfg, rank, group.size, group.expert_parallel);
    // The same seed on every rank: replicated tensors (norms, routers, embedding) agree.
    return CudaRunner::dummy(cfg, rank_opt, nvfp4_experts, seed);
  });
  return t;
}

std::vector<int32_t> TensorParallelRunner::forward_argmax(std::span<const ForwardStep> steps) {
  return on_all<std::vector<int32_t>>([&](CudaRunner& c) { return c.forward_argmax(steps); });
}

std::vector<int32_t> TensorParallelRunner::mtp_forward_argmax(std::span<const MtpStep> steps) {
  return on_all<std::vector<int32_t>>([&](CudaRunner& c) { return c.mtp_forward_argmax(steps); });
}

void TensorParallelRunner::fill_context_for_benchmark(SequenceId seq, int64_t length) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->fill_context_for_benchmark(seq, length); });
}

void TensorParallelRunner::reset_profile() {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->reset_profile(); });
}

void TensorParallelRunner::set_profiling(bool on) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->set_profiling(on); });
}

void TensorParallelRunner::synchronize() {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->synchronize(); });
}

std::string TensorParallelRunner::device_name() const {
  return ranks_[0]->device_name() + " x " + std::to_string(size()) + " (tensor parallel)";
}

// fn on every rank; the ranks' answers (ids, or 0: no room) must agree, since each holds an equal
// slice and sees the same calls.
int64_t TensorParallelRunner::agreed(const std::function<int64_t(CudaRunner&)>& fn, const char* what) {
  std::vector<int64_t> ids(ranks_.size());
  on_all_ranks([&](int r) { ids[size_t(r)] = fn(*ranks_[size_t(r)]); });
  for (int64_t id : ids) FATHOM_CHECK(id == ids[0], "tensor-parallel ranks disagree on ", what, ": ", id, " vs ", ids[0]);
  return ids[0];
}

SequenceId TensorParallelRunner::add_sequence() {
  return agreed([](CudaRunner& c) { return c.add_sequence(); }, "a new sequence's id");
}

void TensorParallelRunner::remove_sequence(SequenceId seq) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->remove_sequence(seq); });
}

int64_t TensorParallelRunner::save_snapshot(SequenceId seq) {
  return agreed([&](CudaRunner& c) { return c.save_snapshot(seq); }, "a snapshot's id");
}

SequenceId TensorParallelRunner::add_sequence_from(int64_t snapshot) {
  return agreed([&](CudaRunner& c) { return c.add_sequence_from(snapshot); }, "a new sequence's id");
}

void TensorParallelRunner::drop_snapshot(int64_t snapshot) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->drop_snapshot(snapshot); });
}

void TensorParallelRunner::set_host_snapshot_budget(int64_t bytes) {
  const int64_t per_rank = bytes / int64_t(ranks_.size());
  on_all_ranks([&](int r) { ranks_[size_t(r)]->set_host_snapshot_budget(per_rank); });
}

// Ranks hold equal slices, so their pools fill alike: one answer (a new id, or 0: no room) for all.
int64_t TensorParallelRunner::move_snapshot_to_host(int64_t snapshot) {
  return agreed([&](CudaRunner& c) { return c.move_snapshot_to_host(snapshot); }, "a snapshot moved to host memory");
}

int64_t TensorParallelRunner::move_snapshot_from_host(int64_t host_snapshot) {
  return agreed([&](CudaRunner& c) { return c.move_snapshot_from_host(host_snapshot); },
                "a snapshot moved from host memory");
}

void TensorParallelRunner::drop_host_snapshot(int64_t host_snapshot) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->drop_host_snapshot(host_snapshot); });
}

int64_t TensorParallelRunner::snapshot_bytes(int64_t snapshot) const {
  int64_t bytes = 0;  // host bookkeeping only: no rank thread needed
  for (const auto& rank : ranks_) bytes += rank->snapshot_bytes(snapshot);
  return bytes;
}

ForwardOutput TensorParallelRunner::forward(std::span<const ForwardStep> steps) {
  return on_all<ForwardOutput>([&](CudaRunner& c) { return c.forward(steps); });
}

void TensorParallelRunner::rollback(SequenceId seq, int64_t new_length) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->rollback(seq, new_length); });
}

ForwardOutput TensorParallelRunner::mtp_forward(std::span<const MtpStep> steps) {
  return on_all<ForwardOutput>([&](CudaRunner& c) { return c.mtp_forward(steps); });
}

void TensorParallelRunner::mtp_rollback(SequenceId seq, int64_t new_length) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->mtp_rollback(seq, new_length); });
}

SampledOutput TensorParallelRunner::forward_sampled(std::span<const ForwardStep> steps,
                                                    std::span<const RowSampling> rows,
                                                    std::span<const LogitAdjustment> adjust, bool want_hidden,
                                                    std::span<const uint32_t> masks) {
  return on_all<SampledOutput>(
      [&](CudaRunner& c) { return c.forward_sampled(steps, rows, adjust, want_hidden, masks); });
}

GreedyOutput TensorParallelRunner::mtp_forward_greedy(std::span<const MtpStep> steps) {
  return on_all<GreedyOutput>([&](CudaRunner& c) { return c.mtp_forward_greedy(steps); });
}

void TensorParallelRunner::launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                          std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                                          bool defer_masks) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->launch_sampled(steps, rows, adjust, masks, defer_masks); });
}

int64_t TensorParallelRunner::deferred_mask_tokens() const { return ranks_[0]->deferred_mask_tokens(); }

void TensorParallelRunner::supply_masks(std::span<const uint32_t> masks) {
  on_all_ranks([&](int r) { ranks_[size_t(r)]->supply_masks(masks); });
}

SampledOutput TensorParallelRunner::finish_sampled() {
  return on_all<SampledOutput>([&](CudaRunner& c) { return c.finish_sampled(); });
}

int64_t TensorParallelRunner::kv_capacity_tokens() const {
  int64_t n = ranks_[0]->kv_capacity_tokens();
  for (const auto& r : ranks_) n = std::min(n, r->kv_capacity_tokens());
  return n;
}

int64_t TensorParallelRunner::max_sequence_length() const {
  int64_t n = ranks_[0]->max_sequence_length();
  for (const auto& r : ranks_) n = std::min(n, r->max_sequence_length());
  return n;
}

}  // namespace fathom::cuda
