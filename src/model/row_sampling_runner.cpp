#include "model/row_sampling_runner.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/row_sampler.h"

namespace fathom {

RowSamplingRunner::RowSamplingRunner(std::unique_ptr<ModelRunner> inner) : inner_(std::move(inner)) {
  FATHOM_CHECK(inner_ != nullptr, "RowSamplingRunner: no engine to wrap");
}

void RowSamplingRunner::remove_sequence(SequenceId seq) {
  last_token_.erase(seq);
  last_round_.erase(seq);
  kept_.erase(seq);
  inner_->remove_sequence(seq);
}

VerifyDraftOutput RowSamplingRunner::forward_verify_draft(std::span<const ForwardStep> steps,
                                                          std::span<const RowSampling> rows,
                                                          std::span<const LogitAdjustment> adjust,
                                                          std::span<const uint32_t> masks) {
  FATHOM_CHECK(launched_.empty() && rounds_.empty(), "forward_verify_draft: an overlapped step is still in flight");
  return round(steps, rows, adjust, masks);
}

VerifyDraftOutput RowSamplingRunner::round(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                           std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks) {
  const int64_t V = config().vocab_size;
  std::vector<RowSampling> rs(rows.begin(), rows.end());
  std::vector<float> q_in;  // the kept distributions of the drafts these rows verify
  bool draws = false;
  int64_t row = 0;
  for (const ForwardStep& st : steps) {
    for (int64_t r = row; r < row + int64_t(st.tokens.size()) && size_t(r) < rs.size(); ++r) {
      RowSampling& p = rs[size_t(r)];
      draws = draws || p.draw_draft;
      if (p.draft_q != kDraftQKept) continue;
      const auto it = kept_.find(st.seq);
      p.draft_q = -1;
      if (it == kept_.end() || it->second.draw != p.draw || it->second.token != p.draft) continue;
      p.draft_q = int32_t(q_in.size() / size_t(V));
      q_in.insert(q_in.end(), it->second.q.begin(), it->second.q.end());
    }
    row += int64_t(st.tokens.size());
  }
  std::vector<float> q_drawn;
  VerifyDraftOutput out = verify_draft_on_host(*inner_, steps, rs, adjust, masks, q_in.empty() ? nullptr : q_in.data(),
                                               draws ? &q_drawn : nullptr);
  // Each sequence's next draft is the MTP row after its last accepted one: keep that row's q.
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t r0 = out.row_begin[i], n = int64_t(steps[i].tokens.size());
    int64_t a = 0;
    while (!out.samples.empty() && a + 1 < n && out.samples[size_t(r0 + a)].accepted != 0) ++a;
    const size_t at = size_t(r0 + a);
    if (!draws || rs.empty() || !rs[at].draw_draft) {
      kept_.erase(steps[i].seq);
      continue;
    }
    KeptDraft& k = kept_[steps[i].seq];
    k.draw = rs[at].draw + 1;
    k.token = out.draft[at];
    k.q.assign(q_drawn.begin() + int64_t(at) * V, q_drawn.begin() + int64_t(at + 1) * V);
  }
  return out;
}

// The round computes at once, chained steps resolved from the outcome recorded at the previous
// launch (what the GPU does on the device); only its output waits for finish_verify_draft.
void RowSamplingRunner::launch_verify_draft(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                            std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks) {
  FATHOM_CHECK(launched_.empty() && rounds_.size() < 2,
               "launch_verify_draft: two rounds (or an overlapped step) are still in flight");
  std::vector<ForwardStep> resolved(steps.begin(), steps.end());
  std::vector<std::array<int32_t, 2>> tokens(steps.size());
  std::vector<RowSampling> rs(rows.begin(), rows.end());
  int64_t row = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const ForwardStep& st = steps[i];
    const int64_t n = int64_t(st.tokens.size());
    const bool chained = std::find(st.tokens.begin(), st.tokens.end(), kPendingToken) != st.tokens.end();
    if (chained) {
      FATHOM_CHECK(n == 2 && st.tokens[0] == kPendingToken && st.tokens[1] == kPendingToken,
                   "launch_verify_draft: a chained step of sequence ", st.seq, " must be two pending tokens");
      const auto it = last_round_.find(st.seq);
      FATHOM_CHECK(it != last_round_.end(), "launch_verify_draft: sequence ", st.seq, " has no round to continue");
      const RoundOutcome& o = it->second;
      const int64_t length = o.length_before + 1 + o.accepted;
      inner_->rollback(st.seq, length);
      inner_->mtp_rollback(st.seq, length);
      tokens[i] = {o.target, o.draft};
      resolved[i].tokens = tokens[i];
      for (int64_t r = row; r < row + n && size_t(r) < rs.size(); ++r) {
        rs[size_t(r)].draw += uint64_t(o.accepted);
        if (rs[size_t(r)].draft == kDraftFromRound) rs[size_t(r)].draft = o.draft;
      }
    }
    row += n;
  }
  std::vector<int64_t> before(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) before[i] = inner_->length(steps[i].seq);
  VerifyDraftOutput out = round(resolved, rs, adjust, masks);
  for (size_t i = 0; i < resolved.size(); ++i) {  // this round's outcome, for a step that continues it
    const int64_t r0 = out.row_begin[i], n = int64_t(resolved[i].tokens.size());
    int a = 0;
    while (a + 1 < n && (out.samples.empty() ? out.target[size_t(r0 + a)] == resolved[i].tokens[size_t(a + 1)]
                                              : out.samples[size_t(r0 + a)].accepted != 0))
      ++a;
    last_round_[resolved[i].seq] = RoundOutcome{before[i], out.target[size_t(r0 + a)], out.draft[size_t(r0 + a)], a};
  }
  rounds_.push_back(std::move(out));
}

VerifyDraftOutput RowSamplingRunner::finish_verify_draft() {
  FATHOM_CHECK(!rounds_.empty(), "finish_verify_draft: no round was launched");
  VerifyDraftOutput out = std::move(rounds_.front());
  rounds_.pop_front();
  return out;
}

SampledOutput RowSamplingRunner::forward_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                                 std::span<const LogitAdjustment> adjust, bool want_hidden,
                                                 std::span<const uint32_t> masks) {
  launch(steps, rows, adjust, want_hidden, masks, /*defer_masks=*/false);
  return finish_sampled();
}

void RowSamplingRunner::launch_sampled(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                                       std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                                       bool defer_masks) {
  launch(steps, rows, adjust, /*want_hidden=*/false, masks, defer_masks);
}

void RowSamplingRunner::launch(std::span<const ForwardStep> steps, std::span<const RowSampling> rows,
                               std::span<const LogitAdjustment> adjust, bool want_hidden,
                               std::span<const uint32_t> masks, bool defer_masks) {
  FATHOM_CHECK(launched_.size() < 2, "launch_sampled: two launched steps are not finished yet");
  FATHOM_CHECK(rounds_.empty(), "launch_sampled: an MTP round is still in flight");
  FATHOM_CHECK(launched_.empty() || launched_.back().sampled,
               "launch_sampled: the previous step still waits for its token masks");
  // A pending token is the one the sequence's last sampled row chose (sampled already: launches
  // compute at once, and a step waiting for its masks blocks the next launch).
  std::vector<std::vector<int32_t>> resolved_tokens(steps.size());
  std::vector<ForwardStep> resolved(steps.begin(), steps.end());
  for (size_t i = 0; i < steps.size(); ++i) {
    if (std::find(steps[i].tokens.begin(), steps[i].tokens.end(), kPendingToken) == steps[i].tokens.end()) continue;
    std::vector<int32_t>& t = resolved_tokens[i];
    t.assign(steps[i].tokens.begin(), steps[i].tokens.end());
    for (int32_t& x : t) {
      if (x != kPendingToken) continue;
      const auto it = last_token_.find(steps[i].seq);
      FATHOM_CHECK(it != last_token_.end(), "launch_sampled: sequence ", steps[i].seq,
                   " has a pending token but no sampled row before it");
      x = it->second;
    }
    resolved[i].tokens = t;
  }
  const int64_t W = mask_words(config().vocab_size);
  for (const RowSampling& r : rows) {  // before the forward, which advances the sequences
    FATHOM_CHECK(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(),
                 "forward_sampled: a row's adjustments lie outside the list");
    FATHOM_CHECK(defer_masks || r.skip || r.mask_row < 0 || (int64_t(r.mask_row) + 1) * W <= int64_t(masks.size()),
                 "forward_sampled: a row's token mask lies outside the mask table");
  }
  Launched l;
  l.fo = inner_->forward(resolved);
  FATHOM_CHECK(int64_t(rows.size()) == l.fo.rows, "forward_sampled: ", rows.size(), " sampling rows for ", l.fo.rows,
               " logits rows");
  l.rows.assign(rows.begin(), rows.end());
  l.adjust.assign(adjust.begin(), adjust.end());
  l.last_row_seq.assign(size_t(l.fo.rows), 0);
  for (size_t i = 0; i < steps.size(); ++i)  // as the device's state slots: a step's last row, unless all_rows
    if (!steps[i].all_rows) l.last_row_seq[size_t(l.fo.row_begin[i])] = steps[i].seq;
  l.want_hidden = want_hidden;
  if (!defer_masks) sample(l, masks);
  launched_.push_back(std::move(l));
}

void RowSamplingRunner::sample(Launched& l, std::span<const uint32_t> masks) {
  const int64_t V = config().vocab_size, W = mask_words(V);
  for (const RowSampling& r : l.rows)
    FATHOM_CHECK(r.skip || r.mask_row < 0 || (int64_t(r.mask_row) + 1) * W <= int64_t(masks.size()),
                 "forward_sampled: a row's token mask lies outside the mask table");
  SampledOutput& out = l.out;
  out.rows = l.fo.rows;
  out.row_begin = l.fo.row_begin;
  out.samples.resize(size_t(out.rows));
  bool any_logprobs = false;
  for (const RowSampling& r : l.rows) any_logprobs = any_logprobs || (r.logprobs >= 0 && !r.skip);
  if (any_logprobs) {
    out.top_ids.assign(size_t(out.rows) * kMaxTopLogprobs, -1);
    out.top_logprobs.assign(size_t(out.rows) * kMaxTopLogprobs, 0.f);
  }
  for (int64_t r = 0; r < out.rows; ++r)  // raw rows, before the sampler adjusts them in place
    if (l.rows[size_t(r)].keep_logits && !l.rows[size_t(r)].skip) {
      out.kept_rows.push_back(r);
      out.kept_logits.insert(out.kept_logits.end(), l.fo.logits.begin() + r * V, l.fo.logits.begin() + (r + 1) * V);
    }
  cpu::sample_rows(l.fo.logits.data(), out.rows, V, l.rows.data(), l.adjust.data(), out.samples.data(),
                   any_logprobs ? out.top_ids.data() : nullptr, any_logprobs ? out.top_logprobs.data() : nullptr,
                   masks.empty() ? nullptr : masks.data());
  for (int64_t r = 0; r < out.rows; ++r)
    if (const SequenceId seq = l.last_row_seq[size_t(r)]; seq != 0 && !l.rows[size_t(r)].skip)
      last_token_[seq] = out.samples[size_t(r)].token;
  if (l.want_hidden) {
    out.hidden = std::move(l.fo.hidden);
    out.hidden_row_begin = std::move(l.fo.hidden_row_begin);
  }
  l.fo = ForwardOutput{};
  l.sampled = true;
}

int64_t RowSamplingRunner::deferred_mask_tokens() const { return std::numeric_limits<int64_t>::max(); }

void RowSamplingRunner::supply_masks(std::span<const uint32_t> masks) {
  FATHOM_CHECK(!launched_.empty() && !launched_.back().sampled,
               "supply_masks: no launched step waits for its token masks");
  sample(launched_.back(), masks);
}

SampledOutput RowSamplingRunner::finish_sampled() {
  FATHOM_CHECK(!launched_.empty(), "finish_sampled: no step was launched");
  FATHOM_CHECK(launched_.front().sampled, "finish_sampled: the step still waits for its token masks");
  SampledOutput out = std::move(launched_.front().out);
  launched_.pop_front();
  return out;
}

}  // namespace fathom
