// Draft proposers for speculative decoding, over the ModelRunner interface only (so they run
// unchanged on any engine):
//  * MtpDrafter: the checkpoint's own MTP (NEXTN) layer, a greedy chain of K drafts
//    (qwen35-architecture.md §5.2). Step 1 = the MTP row that consumed the target's post-norm
//    hidden at the last position and the token sampled after it; step s >= 2 feeds the MTP's own
//    post-norm output and the previous draft at the next position. After verification the
//    accepted tokens are run through the MTP layer again ("draft extend") with the target's true
//    hidden states, after rolling the MTP cache back past the chained (scratch) rows; the last
//    row of that extend is the next round's first draft.
//  * NgramDrafter: prompt lookup over the sequence so far (vLLM `prompt_lookup_min/max`
//    conventions): the longest suffix n-gram, n from max down to min, that occurs earlier in the
//    sequence; the earliest such occurrence wins; propose up to K tokens that followed it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/model_runner.h"

namespace fathom {

// Target rows the drafter may consume: post-norm hidden states at positions pos, pos+1, ... and
// the token that follows each of them (the last one being the token just sampled).
struct DraftExtend {
  SequenceId seq;
  int64_t pos;
  std::span<const float> hidden;         // [n, hidden]
  std::span<const int32_t> next_tokens;  // [n]
};

struct DraftRequest {
  SequenceId seq;
  std::span<const int32_t> context;  // prompt + generated tokens, the last one not yet fed to the target
  int max_drafts = 0;
  std::vector<int32_t> drafts;  // out: at most max_drafts tokens
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Whether extend() needs the target's hidden states (all rows of prefill and verification).
  virtual bool needs_hidden() const = 0;
  virtual void extend(std::span<const DraftExtend> batch) = 0;
  virtual void propose(std::span<DraftRequest> batch) = 0;
  virtual void release(SequenceId seq) = 0;
};

class MtpDrafter final : public Drafter {
 public:
  explicit MtpDrafter(ModelRunner& runner);
  std::string name() const override { return "mtp"; }
  bool needs_hidden() const override { return true; }
  void extend(std::span<const DraftExtend> batch) override;
  void propose(std::span<DraftRequest> batch) override;
  void release(SequenceId seq) override { state_.erase(seq); }

  // Every first draft made by extend(): (sequence, MTP position of the row, token). For tests.
  struct Trace {
    SequenceId seq;
    int64_t pos;
    int32_t draft;
  };
  std::vector<Trace> trace;
  bool record_trace = false;

 private:
  struct State {
    int32_t first_draft = -1;   // argmax of the last extend row
    std::vector<float> hidden;  // that row's post-norm output (input of chain step 2)
    int64_t mtp_length = 0;     // the MTP cache length right after that extend
  };
  ModelRunner& runner_;
  std::map<SequenceId, State> state_;
};

// Prompt lookup: the drafts following the longest (min_n..max_n) suffix match, at most k.
std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int min_n, int max_n, int k);

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int min_n, int max_n);
  std::string name() const override { return "ngram"; }
  bool needs_hidden() const override { return false; }
  void extend(std::span<const DraftExtend>) override {}
  void propose(std::span<DraftRequest> batch) override;
  void release(SequenceId) override {}

 private:
  int min_n_, max_n_;
};

}  // namespace fathom
