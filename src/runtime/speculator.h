// The drafting side of speculative decoding for the serving engine's sequences (engine.h; offline
// generation runs through it too): the drafter (MTP layer or n-grams), the
// adaptive draft length of each sequence (spec_policy.h) and the MTP's backlog of target rows.
// Callers keep the acceptance statistics (spec_stats.h).
//
// MTP backlog: the MTP layer must see every target position (its KV cache is positional), but it
// only has to be up to date when a sequence drafts. Target rows are therefore queued per
// sequence and run through the MTP layer in one batched "draft extend" just before the sequence
// next drafts (or once the queue grows past a cap); a sequence the policy retires stops
// queueing, so a model whose drafts fail costs little more than plain decoding.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model_runner.h"
#include "runtime/spec_drafter.h"
#include "runtime/spec_policy.h"

namespace fathom {

enum class SpecAlgorithm { None, Mtp, Ngram };

struct SpecOptions {
  SpecAlgorithm algorithm = SpecAlgorithm::None;
  int num_steps = 3;  // K: drafts per round (SGLang --speculative-num-steps; chain, topk 1)
  int ngram_min = 1, ngram_max = 12;  // n-gram match window (SGLang defaults 1..12)
  bool adaptive = true;               // per-sequence draft length and back-off (spec_policy.h)
  // Serving: no drafts in a step with at least this many decoding sequences (0: no limit; -1:
  // chosen from measured rates where steps overlap, spec_batch_limit.h). At large batches a
  // verify step costs nearly (K+1) decode steps (vLLM's --speculative-disable-by-batch-size).
  int disable_by_batch_size = 0;
  // Fused MTP rounds draw sampled requests' drafts from the MTP layer's distribution q and verify
  // them with min(1, p / q) (--speculative-sampled-drafts; runners with draws_sampled_drafts()).
  bool sampled_drafts = false;
  // Tests: when set, every first MTP draft (made by a draft extend) is appended here.
  std::vector<MtpDrafter::Trace>* mtp_trace = nullptr;
};

// "none", "mtp", "nextn" (alias of mtp, as SGLang), "ngram" (case-insensitive).
SpecAlgorithm parse_spec_algorithm(const std::string& name);
const char* spec_algorithm_name(SpecAlgorithm a);

class Speculator {
 public:
  // `max_tokens_per_forward` bounds the tokens of one MTP forward (the runner's step size).
  Speculator(ModelRunner& runner, const SpecOptions& opt, int64_t max_tokens_per_forward);
  ~Speculator();

  const SpecOptions& options() const { return opt_; }
  int max_drafts() const { return opt_.num_steps; }
  // Whether every target forward must return all rows' hidden states (they feed the MTP layer).
  bool needs_hidden() const { return drafter_->needs_hidden(); }

  // The target consumed `hidden.size() / H` tokens of `seq` starting at position `pos`; `next`
  // holds the token that follows each of them (the last one: the token just emitted).
  void observe(SequenceId seq, int64_t pos, std::span<const float> hidden, std::span<const int32_t> next);
  // Runs the MTP over backlogs longer than the cap (call once after a step's observe() calls).
  void flush_long_backlogs();
  // Runs the MTP over `seq`'s backlog: its MTP cache then covers every position whose next token
  // is known (before a prefix snapshot).
  void catch_up(SequenceId seq) { flush({seq}); }

  // Fills each request's drafts: at most min(max_drafts, the sequence's adaptive length) tokens.
  void propose(std::span<DraftRequest> batch);
  // Drafts `seq` may verify this round by its adaptive length, at most max_drafts, for drafts
  // made elsewhere (a fused MTP round's); call once per round, as propose() does.
  int draft_budget(SequenceId seq, int max_drafts);
  // What draft_budget would return, without taking the round.
  int peek_draft_budget(SequenceId seq, int max_drafts) const;
  // Whether `seq` stopped drafting for good (its acceptance was too low).
  bool retired(SequenceId seq) const;
  // A draft made outside the drafter (a fused MTP round's row at MTP position `pos`), traced with
  // the drafter's own when SpecOptions::mtp_trace is set.
  void trace_draft(SequenceId seq, int64_t pos, int32_t draft);
  // The verification of `seq`'s round: `drafted` drafts, `accepted` of them accepted (adapts
  // the sequence's draft length; a released sequence is ignored).
  void record(SequenceId seq, int drafted, int accepted);
  void release(SequenceId seq);

 private:
  struct SeqState {
    DraftLengthState length;
    int64_t backlog_pos = -1;  // position of the first queued row (-1: none)
    std::vector<float> backlog_hidden;
    std::vector<int32_t> backlog_next;
    void drop_backlog() {
      backlog_pos = -1;
      backlog_hidden.clear();
      backlog_next.clear();
    }
  };
  SeqState& state(SequenceId seq);
  void flush(const std::vector<SequenceId>& seqs);

  ModelRunner& runner_;
  SpecOptions opt_;
  int64_t max_tokens_;
  DraftLengthPolicy policy_;
  std::unique_ptr<Drafter> drafter_;
  std::map<SequenceId, SeqState> seqs_;
};

}  // namespace fathom
