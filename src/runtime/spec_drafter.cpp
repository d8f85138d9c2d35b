#include "runtime/spec_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace fathom {

MtpDrafter::MtpDrafter(ModelRunner& runner) : runner_(runner) {
  FATHOM_CHECK(runner.has_mtp(), "speculative algorithm mtp/nextn: the model has no MTP layer loaded "
                                 "(config mtp_num_hidden_layers = 0, or opened without it)");
}

void MtpDrafter::extend(std::span<const DraftExtend> batch) {
  if (batch.empty()) return;
  const int64_t H = runner_.config().hidden_size;
  std::vector<MtpStep> steps;
  for (const DraftExtend& e : batch) {
    // Drop the chained draft rows of the previous round (and anything else past pos).
    if (runner_.mtp_length(e.seq) > e.pos) runner_.mtp_rollback(e.seq, e.pos);
    FATHOM_CHECK(runner_.mtp_length(e.seq) == e.pos, "MTP draft extend at position ", e.pos,
                 " but the MTP cache holds ", runner_.mtp_length(e.seq), " positions");
    FATHOM_CHECK(int64_t(e.hidden.size()) == int64_t(e.next_tokens.size()) * H, "MTP draft extend: ",
                 e.hidden.size() / H, " hidden rows for ", e.next_tokens.size(), " tokens");
    steps.push_back(MtpStep{e.seq, e.hidden, e.next_tokens, /*all_rows=*/false});
  }
  GreedyOutput out = runner_.mtp_forward_greedy(steps);
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t row = out.row_begin[i];
    State& st = state_[batch[i].seq];
    st.first_draft = out.ids[size_t(row)];
    st.hidden.assign(out.hidden.begin() + row * H, out.hidden.begin() + (row + 1) * H);
    st.mtp_length = batch[i].pos + int64_t(batch[i].next_tokens.size());
    if (record_trace)
      trace.push_back({batch[i].seq, batch[i].pos + int64_t(batch[i].next_tokens.size()) - 1, st.first_draft});
  }
}

void MtpDrafter::propose(std::span<DraftRequest> batch) {
  const int64_t H = runner_.config().hidden_size;
  std::vector<size_t> active;
  std::vector<std::vector<float>> hidden(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    DraftRequest& r = batch[i];
    r.drafts.clear();
    auto it = state_.find(r.seq);
    if (r.max_drafts <= 0 || it == state_.end() || it->second.first_draft < 0) continue;
    r.drafts.push_back(it->second.first_draft);
    hidden[i] = it->second.hidden;
    // A chain proposed earlier but never verified (its sequence was not scheduled) left rows
    // past the extend; the new chain starts right after the extend again.
    if (r.max_drafts > 1 && runner_.mtp_length(r.seq) > it->second.mtp_length)
      runner_.mtp_rollback(r.seq, it->second.mtp_length);
    if (r.max_drafts > 1) active.push_back(i);
  }
  // Chain steps 2..K: one batched MTP forward per step over the sequences that want more drafts.
  // These rows land in the MTP cache past the accepted length; extend() rolls them back.
  while (!active.empty()) {
    std::vector<MtpStep> steps;
    for (size_t i : active)
      steps.push_back(MtpStep{batch[i].seq, hidden[i], std::span<const int32_t>(&batch[i].drafts.back(), 1), false});
    GreedyOutput out = runner_.mtp_forward_greedy(steps);
    std::vector<size_t> still;
    for (size_t j = 0; j < active.size(); ++j) {
      const size_t i = active[j];
      const int64_t row = out.row_begin[j];
      batch[i].drafts.push_back(out.ids[size_t(row)]);
      hidden[i].assign(out.hidden.begin() + row * H, out.hidden.begin() + (row + 1) * H);
      if (int(batch[i].drafts.size()) < batch[i].max_drafts) still.push_back(i);
    }
    active.swap(still);
  }
}

std::vector<int32_t> ngram_propose(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const int64_t L = int64_t(tokens.size());
  min_n = std::max(min_n, 1);
  if (k <= 0 || L < min_n) return {};
  for (int64_t n = std::min<int64_t>(max_n, L - 1); n >= min_n; --n) {
    const int32_t* suffix = tokens.data() + (L - n);
    // Earlier occurrences only (the suffix itself starts at L - n); the earliest wins.
    for (int64_t i = 0; i + n < L; ++i) {
      if (!std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const int64_t begin = i + n, end = std::min<int64_t>(L, begin + k);
      return std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end);
    }
  }
  return {};
}

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  FATHOM_CHECK(min_n >= 1 && max_n >= min_n, "n-gram speculation: need 1 <= min (", min_n, ") <= max (", max_n,
               ")");
}

void NgramDrafter::propose(std::span<DraftRequest> batch) {
  for (DraftRequest& r : batch) r.drafts = ngram_propose(r.context, min_n_, max_n_, r.max_drafts);
}

}  // namespace fathom
