// Acceptance statistics of speculative decoding (per request, or merged over a batch).
#pragma once
#include <cstdint>
#include <vector>

namespace fathom {

struct SpecStats {
  int64_t steps = 0;            // verification rounds (target forwards this sequence took part in)
  int64_t draft_rounds = 0;     // rounds that verified at least one draft
  int64_t draft_tokens = 0;     // drafts proposed and verified
  int64_t accepted_tokens = 0;  // drafts accepted (bonus/correction tokens not counted)
  std::vector<int64_t> drafted_at, accepted_at;  // per draft position 0..K-1

  double acceptance_rate() const { return draft_tokens ? double(accepted_tokens) / double(draft_tokens) : 0.0; }
  // Accepted / drafted at each draft position (conditional on being drafted at all).
  std::vector<double> acceptance_by_position() const {
    std::vector<double> r(drafted_at.size(), 0.0);
    for (size_t i = 0; i < r.size(); ++i) r[i] = drafted_at[i] ? double(accepted_at[i]) / double(drafted_at[i]) : 0.0;
    return r;
  }
  // Mean tokens emitted per verification round (accepted drafts + the one target token).
  double tokens_per_step() const { return steps ? double(accepted_tokens + steps) / double(steps) : 0.0; }
  // The same over the rounds that had drafts (SGLang's "accept length").
  double mean_accepted_length() const {
    return draft_rounds ? double(accepted_tokens + draft_rounds) / double(draft_rounds) : 0.0;
  }

  void record(int drafted, int accepted) {
    ++steps;
    if (drafted > 0) ++draft_rounds;
    draft_tokens += drafted;
    accepted_tokens += accepted;
    if (drafted_at.size() < size_t(drafted)) {
      drafted_at.resize(size_t(drafted), 0);
      accepted_at.resize(size_t(drafted), 0);
    }
    for (int i = 0; i < drafted; ++i) ++drafted_at[size_t(i)];
    for (int i = 0; i < accepted; ++i) ++accepted_at[size_t(i)];
  }
  void merge(const SpecStats& o) {
    steps += o.steps;
    draft_rounds += o.draft_rounds;
    draft_tokens += o.draft_tokens;
    accepted_tokens += o.accepted_tokens;
    if (drafted_at.size() < o.drafted_at.size()) {
      drafted_at.resize(o.drafted_at.size(), 0);
      accepted_at.resize(o.drafted_at.size(), 0);
    }
    for (size_t i = 0; i < o.drafted_at.size(); ++i) {
      drafted_at[i] += o.drafted_at[i];
      accepted_at[i] += o.accepted_at[i];
    }
  }
};

}  // namespace fathom
