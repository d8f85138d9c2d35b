// Adaptive draft length for speculative decoding, per sequence.
//
// Drafting only pays when drafts are accepted: a verify step of k drafts costs more than a plain
// decode step (k more tokens through the target, the state history kept), and an MTP drafter
// also runs its layer over every position of the sequence to stay in sync. So:
//  * the next round drafts (accepted + 1) tokens, at most K: a run of full acceptances grows
//    back to K one step at a time;
//  * once a sequence has had kEvidence drafts, a round at 1 draft that accepts nothing starts a
//    back-off: the sequence decodes plainly for 2, 4, ... 64 rounds (doubling with every miss in
//    a row) before it probes with 1 draft again; any acceptance ends the back-off;
//  * with `retire` (drafters with a per-position cost, i.e. MTP), a sequence whose acceptance
//    rate is below kRetireRate after kEvidence drafts stops drafting for good.
// At acceptance 0 a sequence drafts 8 tokens and then stops (MTP) or probes about once every
// 64 rounds (n-grams); at acceptance 0.6 the chance of 8 drafts with at most one accepted is
// under 1%. Output is unaffected: drafts only change how many target forwards a sequence needs,
// never which tokens it emits.
#pragma once
#include <algorithm>
#include <cstdint>

namespace fathom {

struct DraftLengthState {
  int k = 0;              // drafts for the next round that drafts
  int skip = 0;           // plain rounds left before the next probe
  int misses = 0;         // rounds in a row at 1 draft with nothing accepted
  int64_t drafted = 0, accepted = 0;
  bool retired = false;   // drafting stopped for good
};

class DraftLengthPolicy {
 public:
  static constexpr int kMaxBackoff = 64;
  static constexpr int64_t kEvidence = 8;
  static constexpr double kRetireRate = 0.1;

  DraftLengthPolicy(int max_drafts, bool adaptive, bool retire)
      : max_(max_drafts), adaptive_(adaptive), retire_(retire) {}
  DraftLengthState start() const { return DraftLengthState{max_}; }

  // What next() would return, without taking the round.
  int peek(const DraftLengthState& s) const {
    if (!adaptive_) return max_;
    return s.retired || s.skip > 0 ? 0 : s.k;
  }

  // Drafts to propose this round (0: a plain round). Call once per round.
  int next(DraftLengthState& s) const {
    if (!adaptive_) return max_;
    if (s.retired) return 0;
    if (s.skip > 0) {
      --s.skip;
      return 0;
    }
    return s.k;
  }

  void update(DraftLengthState& s, int drafted, int accepted) const {
    if (!adaptive_ || drafted <= 0) return;
    s.drafted += drafted;
    s.accepted += accepted;
    s.k = std::clamp(accepted + 1, 1, max_);
    const bool enough = s.drafted >= kEvidence;
    if (retire_ && enough && double(s.accepted) < kRetireRate * double(s.drafted)) s.retired = true;
    if (accepted > 0) {
      s.misses = 0;
    } else if (drafted == 1 && enough) {
      ++s.misses;
      s.skip = std::min(kMaxBackoff, 1 << std::min(s.misses, 6));
    }
  }

 private:
  int max_;
  bool adaptive_, retire_;
};

}  // namespace fathom
