// ModelRunner over the CPU reference engine: sequences are SequenceState values in a map.
#pragma once
#include <map>
#include <memory>

#include "model/hybrid_model.h"
#include "model/model_runner.h"

namespace fathom {

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(std::unique_ptr<HybridModel> model) : model_(std::move(model)) {}

  const ModelConfig& config() const override { return model_->config(); }
  std::string device_name() const override { return "cpu"; }
  bool has_mtp() const override { return model_->has_mtp(); }
  SequenceId add_sequence() override;
  void remove_sequence(SequenceId seq) override;
  int64_t length(SequenceId seq) const override;
  int64_t mtp_length(SequenceId seq) const override;
  ForwardOutput forward(std::span<const ForwardStep> steps) override;
  void rollback(SequenceId seq, int64_t new_length) override;
  ForwardOutput mtp_forward(std::span<const MtpStep> steps) override;
  void mtp_rollback(SequenceId seq, int64_t new_length) override;

  const HybridModel& model() const { return *model_; }

 private:
  SequenceState& state(SequenceId seq);
  const SequenceState& state(SequenceId seq) const;

  std::unique_ptr<HybridModel> model_;
  std::map<SequenceId, SequenceState> seqs_;
  SequenceId next_id_ = 1;
};

}  // namespace fathom
