// A runner that chooses each row's token itself, as a GPU engine does, over an engine that
// returns host logits (the CPU engine): forward_sampled, overlapped launches with pending tokens
// and token masks that come later, all by the CPU row sampler (kernels/cpu/row_sampler.h, the
// device sampler's semantics). The serving engine's device-sampling path (overlapped scheduling,
// sampled fused MTP rounds, deferred grammar masks) then runs, and is tested, without a GPU.
// Launches compute at once; "in flight" only means their results wait for finish_sampled().
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <optional>

#include "model/model_runner.h"

namespace fathom {

class RowSamplingRunner final : public ModelRunner {
 public:
  explicit RowSamplingRunner(std::unique_ptr<ModelRunner> inner);
  ModelRunner& inner() { return *inner_; }

  const ModelConfig& config() const override { return inner_->config(); }
  std::string device_name() const override { return inner_->device_name(); }
  bool has_mtp() const override { return inner_->has_mtp(); }
  SequenceId add_sequence() override { return inner_->add_sequence(); }
  void remove_sequence(SequenceId seq) override;
  int64_t length(SequenceId seq) const override { return inner_->length(seq); }
  int64_t mtp_length(SequenceId seq) const override { return inner_->mtp_length(seq); }
  ForwardOutput forward(std::span<const ForwardStep> steps) override { return inner_->forward(steps); }
  void rollback(SequenceId seq, int64_t new_length) override { inner_->rollback(seq, new_length); }
  ForwardOutput mtp_forward(std::span<const MtpStep> steps) override { return inner_->mtp_forward(steps); }
  void mtp_rollback(SequenceId seq, int64_t new_length) override { inner_->mtp_rollback(seq, new_length); }
  GreedyOutput mtp_forward_greedy(std::span<const MtpStep> steps) override { return inner_->mtp_forward_greedy(steps); }
  bool supports_fused_mtp_round() const override { return inner_->supports_fused_mtp_round(); }
  VerifyDraftOutput forward_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows = {},
                                         std::span<const LogitAdjustment> adjust = {},
                                         std::span<const uint32_t> masks = {}) override;
  bool supports_chained_rounds() const override { return inner_->supports_fused_mtp_round(); }
  bool draws_sampled_drafts() const override { return inner_->supports_fused_mtp_round(); }
  void launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows = {},
                           std::span<const LogitAdjustment> adjust = {},
                           std::span<const uint32_t> masks = {}) override;
  VerifyDraftOutput finish_verify_draft() override;
  // The distribution a sequence's latest drawn draft came from, for the row verifying it: that
  // row's position (RowSampling::draw) and draft must be these, else the deterministic rule runs.
  struct KeptDraft {
    uint64_t draw = 0;
    int32_t token = -1;
    std::vector<float> q;
  };
  const KeptDraft* kept_draft(SequenceId seq) const {  // null: none (tests read it)
    const auto it = kept_.find(seq);
    return it == kept_.end() ? nullptr : &it->second;
  }

  bool samples_on_device() const override { return true; }
  bool returns_kept_logits() const override { return true; }
  SampledOutput forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                std::span<const LogitAdjustment> adjust, bool want_hidden,
                                std::span<const uint32_t> masks = {}) override;
  bool supports_pending_tokens() const override { return true; }
  void launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                      std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks = {},
                      bool defer_masks = false) override;
  int64_t deferred_mask_tokens() const override;
  void supply_masks(std::span<const uint32_t> masks) override;
  SampledOutput finish_sampled() override;

  bool supports_snapshots() const override { return inner_->supports_snapshots(); }
  int64_t save_snapshot(SequenceId seq) override { return inner_->save_snapshot(seq); }
  SequenceId add_sequence_from(int64_t snapshot) override { return inner_->add_sequence_from(snapshot); }
  void drop_snapshot(int64_t snapshot) override { inner_->drop_snapshot(snapshot); }
  int64_t snapshot_bytes(int64_t snapshot) const override { return inner_->snapshot_bytes(snapshot); }
  bool supports_host_snapshots() const override { return inner_->supports_host_snapshots(); }
  void set_host_snapshot_budget(int64_t bytes) override { inner_->set_host_snapshot_budget(bytes); }
  int64_t move_snapshot_to_host(int64_t snapshot) override { return inner_->move_snapshot_to_host(snapshot); }
  int64_t move_snapshot_from_host(int64_t host_snapshot) override {
    return inner_->move_snapshot_from_host(host_snapshot);
  }
  void drop_host_snapshot(int64_t host_snapshot) override { inner_->drop_host_snapshot(host_snapshot); }
  SnapshotRoom snapshot_room() const override { return inner_->snapshot_room(); }
  int64_t kv_capacity_tokens() const override { return inner_->kv_capacity_tokens(); }
  int64_t max_sequence_length() const override { return inner_->max_sequence_length(); }
  int max_sequences() const override { return inner_->max_sequences(); }
  KvCacheDtype kv_cache_dtype() const override { return inner_->kv_cache_dtype(); }

 private:
  // A launched step: its forward done, its rows sampled unless its masks are still to come.
  struct Launched {
    ForwardOutput fo;
    std::vector<RowSampling> rows;
    std::vector<LogitAdjustment> adjust;
    std::vector<SequenceId> last_row_seq;  // per logits row: the sequence whose last token it samples, or 0
    bool want_hidden = false, sampled = false;
    SampledOutput out;
  };
  void launch(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
              std::span<const LogitAdjustment> adjust, bool want_hidden, std::span<const uint32_t> masks,
              bool defer_masks);
  void sample(Launched& l, std::span<const uint32_t> masks);

  // A launched MTP round's outcome for one sequence, which a chained step resolves.
  struct RoundOutcome {
    int64_t length_before = 0;    // the sequence's length before the round
    int32_t target = 0, draft = 0;  // target[a] and draft[a]: the next round's tokens
    int accepted = 0;             // a
  };
  // A fused round on the inner engine, its sampled drafts' distributions kept per sequence and
  // handed to the rows that verify them (kDraftQKept).
  VerifyDraftOutput round(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                          std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks);
  std::unique_ptr<ModelRunner> inner_;
  std::map<SequenceId, KeptDraft> kept_;
  std::deque<Launched> launched_;  // oldest first; at most two
  std::deque<VerifyDraftOutput> rounds_;  // launched MTP rounds, oldest first; at most two
  std::map<SequenceId, RoundOutcome> last_round_;  // each sequence's latest launched round
  std::map<SequenceId, int32_t> last_token_;  // each sequence's last sampled token (kPendingToken's value)
};

}  // namespace fathom
