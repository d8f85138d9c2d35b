// The device sampler's rows (core/row_sampling.h) for the engine's requests: each row carries the
// request's sampling parameters, its draw counter, the draft it verifies, and the adjustments
// (penalties, logit bias, min_tokens masking) the CPU sampler would apply to that row's logits.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "core/row_sampling.h"
#include "runtime/request.h"

namespace fathom {

class SamplingRows {
 public:
  explicit SamplingRows(int64_t vocab) : vocab_(vocab) {}
  // A row nobody reads (a prefill chunk that does not finish its prompt).
  void add_skip();
  // The row that picks output token number r.num_output() + prior.size() of `r`, `prior` being the
  // drafts before it in this step (they count as output when that row is read); `draft` >= 0 is
  // the draft this row verifies.
  // `mask` (mask_words(vocab) words, or null): the tokens a grammar allows at that row.
  // `unread`: output tokens of r chosen before this step but not read yet (a chained MTP round
  // after the round in flight: the one token that round surely gives; the runner adds the
  // drafts it accepts). They count for the draw and min_tokens, not for penalties: a chained
  // round takes no penalised request.
  void add(const Request& r, std::span<const int32_t> prior, int32_t draft, const std::set<int32_t>& eos,
           const uint32_t* mask = nullptr, int64_t unread = 0);
  // The last row added also returns its raw logits (RowSampling::keep_logits).
  void keep_last_logits() { rows_.back().keep_logits = 1; }
  // Rows [begin, end) (one request's in a fused MTP round) draw their MTP drafts from the MTP
  // layer's distribution, and the first verifies its draft against the one kept for it.
  void draw_drafts(size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) rows_[i].draw_draft = 1;
    if (begin < end && rows_[begin].draft != -1) rows_[begin].draft_q = kDraftQKept;
  }
  void clear();
  // The mask of rows whose mask_row is `mask_row` (mask_words(vocab) words), to fill in later.
  uint32_t* mask(int32_t mask_row);

  const std::vector<RowSampling>& rows() const { return rows_; }
  const std::vector<LogitAdjustment>& adjustments() const { return adjust_; }
  const std::vector<uint32_t>& masks() const { return masks_; }

 private:
  std::vector<RowSampling> rows_;
  std::vector<LogitAdjustment> adjust_;
  std::vector<uint32_t> masks_;  // rows' token masks, mask_words(vocab) words each
  int64_t vocab_;
};

}  // namespace fathom
