// ModelRunner over the CPU reference engine: sequences are SequenceState values in a map.
// With a tensor-parallel size N > 1 it holds N models, one slice each (ranks as threads joined by
// a LocalGroup): every call runs on all ranks at once, each on its own states, and returns rank
// 0's output, which the gathers make whole. This is the split the CUDA engine follows, tested
// here without GPUs.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/communicator.h"
#include "model/hybrid_model.h"
#include "model/model_runner.h"

namespace fathom {

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(std::unique_ptr<HybridModel> model);
  // Loads `dir` split over `tensor_parallel_size` ranks (routed experts by expert with
  // expert_parallel); size 1 is the plain engine.
  static std::unique_ptr<CpuRunner> open(const std::filesystem::path& dir, bool with_mtp, int tensor_parallel_size = 1,
                                         bool expert_parallel = false);
  // `full` (the whole model's weights) cut in memory over `tensor_parallel_size` ranks.
  static std::unique_ptr<CpuRunner> split(const ModelConfig& cfg, const ModelWeights& full, int tensor_parallel_size,
                                          bool expert_parallel);
  ~CpuRunner() override;

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  std::string device_name() const override;
  bool has_mtp() const override { return ranks_[0]->has_mtp(); }
  SequenceId add_sequence() override;
  bool supports_snapshots() const override { return true; }
  int64_t save_snapshot(SequenceId seq) override;
  SequenceId add_sequence_from(int64_t snapshot) override;
  void drop_snapshot(int64_t snapshot) override;
  int64_t snapshot_bytes(int64_t snapshot) const override;
  // A bounded room for snapshots, as the CUDA engine has (unbounded by default): at most
  // room.snapshots at once, holding room.tokens tokens of KV counted in whole blocks of
  // `block_size`. Saving past it, or moving a snapshot up from the host tier, returns 0, so that
  // tests on this engine meet the paths a full device room takes (evictions, the live
  // conversations' share, moves down and up).
  void set_snapshot_room(SnapshotRoom room, int block_size);
  SnapshotRoom snapshot_room() const override { return room_; }
  // Host tier: this engine's snapshots are in host memory already, so a move only changes which
  // map holds the state (the engine's tier logic is what it tests; `serve` leaves it off here).
  bool supports_host_snapshots() const override { return true; }
  int64_t move_snapshot_to_host(int64_t snapshot) override;
  int64_t move_snapshot_from_host(int64_t host_snapshot) override;
  void drop_host_snapshot(int64_t host_snapshot) override { host_snapshots_.erase(host_snapshot); }
  void remove_sequence(SequenceId seq) override;
  int64_t length(SequenceId seq) const override;
  int64_t mtp_length(SequenceId seq) const override;
  ForwardOutput forward(std::span<const ForwardStep> steps) override;
  void rollback(SequenceId seq, int64_t new_length) override;
  ForwardOutput mtp_forward(std::span<const MtpStep> steps) override;
  void mtp_rollback(SequenceId seq, int64_t new_length) override;

  KvCacheDtype kv_cache_dtype() const override {
    return ranks_[0]->kv_cache_fp8() ? KvCacheDtype::Fp8E4M3 : KvCacheDtype::Bf16;
  }
  // Every rank's KV cache as the CUDA engine's of that dtype (HybridModel::set_kv_cache_fp8).
  void set_kv_cache_dtype(KvCacheDtype dtype);

  int tensor_parallel_size() const { return int(ranks_.size()); }
  const HybridModel& model() const { return *ranks_[0]; }

 private:
  CpuRunner() = default;
  // An empty runner of `size` ranks joined by a LocalGroup (models still to be placed).
  static std::unique_ptr<CpuRunner> group_of(int size);
  // Sequence `seq`'s state on every rank.
  std::vector<SequenceState>& states(SequenceId seq);
  const std::vector<SequenceState>& states(SequenceId seq) const;
  // fn(rank) on every rank at once; an error in one aborts the group (ending the others' waits)
  // and is rethrown here.
  void on_all_ranks(const std::function<void(int)>& fn);

  std::unique_ptr<LocalGroup> group_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<HybridModel>> ranks_;
  std::map<SequenceId, std::vector<SequenceState>> seqs_;
  SequenceId next_id_ = 1;
  std::map<int64_t, std::vector<SequenceState>> snapshots_;       // prefix snapshots, per rank
  std::map<int64_t, std::vector<SequenceState>> host_snapshots_;  // the host tier's (ids from next_snapshot_ too)
  int64_t next_snapshot_ = 1;
  SnapshotRoom room_;  // 0: no bound
  int room_block_ = 16;
  int64_t room_tokens_used_ = 0;
  // Whether `state` fits the room beside what it holds; the tokens it takes there.
  int64_t room_tokens(const std::vector<SequenceState>& state) const;
  bool room_for(const std::vector<SequenceState>& state) const;
};

}  // namespace fathom
