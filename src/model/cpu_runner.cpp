#include "model/cpu_runner.h"

#include "core/error.h"

namespace fathom {
namespace {

// The CPU engine returns either all rows or the last row per segment for a whole batch;
// steps that differ are run in two groups and merged back in order. `logits_all[i]`: step i
// keeps every logits row (else only its last; its hidden rows are all kept either way).
ForwardOutput merge_outputs(const std::vector<HybridModel::Output>& outs, const std::vector<int>& group_of,
                            const std::vector<std::vector<int64_t>>& rows_in_group, const std::vector<bool>& logits_all,
                            int64_t vocab, int64_t hidden) {
  ForwardOutput res;
  std::vector<size_t> cursor(outs.size(), 0);
  for (size_t i = 0; i < group_of.size(); ++i) {
    const int g = group_of[i];
    const int64_t n = rows_in_group[g][cursor[g]];
    int64_t first = 0;
    for (size_t j = 0; j < cursor[g]; ++j) first += rows_in_group[g][j];
    const int64_t nl = logits_all[i] ? n : 1;
    res.row_begin.push_back(res.rows);
    res.logits.insert(res.logits.end(), outs[g].logits.begin() + (first + n - nl) * vocab,
                      outs[g].logits.begin() + (first + n) * vocab);
    res.rows += nl;
    res.hidden_row_begin.push_back(int64_t(res.hidden.size()) / hidden);
    res.hidden.insert(res.hidden.end(), outs[g].hidden.begin() + first * hidden,
                      outs[g].hidden.begin() + (first + n) * hidden);
    ++cursor[g];
  }
  return res;
}

}  // namespace

SequenceId CpuRunner::add_sequence() {
  SequenceId id = next_id_++;
  seqs_.emplace(id, model_->new_sequence());
  return id;
}

void CpuRunner::remove_sequence(SequenceId seq) { seqs_.erase(seq); }

SequenceState& CpuRunner::state(SequenceId seq) {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "unknown sequence id ", seq);
  return it->second;
}

const SequenceState& CpuRunner::state(SequenceId seq) const {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "unknown sequence id ", seq);
  return it->second;
}

int64_t CpuRunner::length(SequenceId seq) const { return state(seq).num_tokens; }
int64_t CpuRunner::mtp_length(SequenceId seq) const { return state(seq).mtp_kv.length(); }

ForwardOutput CpuRunner::forward(std::span<const ForwardStep> steps) {
  std::vector<HybridModel::Segment> groups[2];  // 0: last row only, 1: all rows
  std::vector<int> group_of;
  std::vector<std::vector<int64_t>> rows(2);
  std::vector<bool> logits_all;
  for (const ForwardStep& s : steps) {
    for (int32_t t : s.tokens)  // before any state changes: the caller may run the others again
      if (t < 0 || t >= config().vocab_size)
        throw SequenceError(s.seq, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                       std::to_string(config().vocab_size) + ")");
    const int g = s.all_rows || s.all_hidden ? 1 : 0;
    groups[g].push_back(HybridModel::Segment{&state(s.seq), s.tokens, s.keep_history});
    group_of.push_back(g);
    rows[g].push_back(g == 1 ? int64_t(s.tokens.size()) : 1);
    logits_all.push_back(s.all_rows);
  }
  std::vector<HybridModel::Output> outs(2);
  for (int g = 0; g < 2; ++g)
    if (!groups[g].empty()) outs[g] = model_->forward(groups[g], g == 1);
  return merge_outputs(outs, group_of, rows, logits_all, config().vocab_size, config().hidden_size);
}

void CpuRunner::rollback(SequenceId seq, int64_t new_length) { model_->rollback(state(seq), new_length); }

ForwardOutput CpuRunner::mtp_forward(std::span<const MtpStep> steps) {
  std::vector<HybridModel::MtpSegment> groups[2];
  std::vector<int> group_of;
  std::vector<std::vector<int64_t>> rows(2);
  std::vector<bool> logits_all;
  for (const MtpStep& s : steps) {
    const int g = s.all_rows ? 1 : 0;
    groups[g].push_back(HybridModel::MtpSegment{&state(s.seq), s.hidden, s.next_tokens});
    group_of.push_back(g);
    rows[g].push_back(s.all_rows ? int64_t(s.next_tokens.size()) : 1);
    logits_all.push_back(s.all_rows);
  }
  std::vector<HybridModel::Output> outs(2);
  for (int g = 0; g < 2; ++g)
    if (!groups[g].empty()) outs[g] = model_->mtp_forward(groups[g], g == 1);
  return merge_outputs(outs, group_of, rows, logits_all, config().vocab_size, config().hidden_size);
}

void CpuRunner::mtp_rollback(SequenceId seq, int64_t new_length) {
  KvCache& kv = state(seq).mtp_kv;
  FATHOM_CHECK(new_length >= 0 && new_length <= kv.length(), "MTP rollback to ", new_length, " of ", kv.length());
  kv.truncate(new_length);
}

}  // namespace fathom
