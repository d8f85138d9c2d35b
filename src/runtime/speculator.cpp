#include "runtime/speculator.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace fathom {

namespace {
constexpr int64_t kBacklogCap = 256;  // queued MTP rows per sequence before they are run anyway
}

SpecAlgorithm parse_spec_algorithm(const std::string& name) {
  std::string s = name;
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s.empty() || s == "none") return SpecAlgorithm::None;
  if (s == "mtp" || s == "nextn") return SpecAlgorithm::Mtp;
  if (s == "ngram") return SpecAlgorithm::Ngram;
  fail("unknown speculative algorithm '", name, "' (expected mtp, nextn or ngram)");
}

const char* spec_algorithm_name(SpecAlgorithm a) {
  switch (a) {
    case SpecAlgorithm::Mtp: return "mtp";
    case SpecAlgorithm::Ngram: return "ngram";
    default: return "none";
  }
}

Speculator::Speculator(ModelRunner& runner, const SpecOptions& opt, int64_t max_tokens_per_forward)
    : runner_(runner), opt_(opt), max_tokens_(max_tokens_per_forward), policy_(opt.num_steps, opt.adaptive, /*retire=*/opt.algorithm == SpecAlgorithm::Mtp) {
  FATHOM_CHECK(opt.num_steps >= 1 && opt.num_steps <= 16, "--speculative-num-steps must be in 1..16 (got ",
               opt.num_steps, ")");
  FATHOM_CHECK(max_tokens_ > 0, "speculative decoding: the forward token budget must be positive");
  switch (opt.algorithm) {
    case SpecAlgorithm::Mtp: {
      auto mtp = std::make_unique<MtpDrafter>(runner);
      mtp->record_trace = opt.mtp_trace != nullptr;
      drafter_ = std::move(mtp);
      break;
    }
    case SpecAlgorithm::Ngram: drafter_ = std::make_unique<NgramDrafter>(opt.ngram_min, opt.ngram_max); break;
    default: fail("Speculator: no speculative algorithm selected");
  }
}

Speculator::~Speculator() {
  if (opt_.mtp_trace && opt_.algorithm == SpecAlgorithm::Mtp) {
    const auto& t = static_cast<MtpDrafter*>(drafter_.get())->trace;
    opt_.mtp_trace->insert(opt_.mtp_trace->end(), t.begin(), t.end());
  }
}

Speculator::SeqState& Speculator::state(SequenceId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) it = seqs_.emplace(seq, SeqState{policy_.start(), -1, {}, {}}).first;
  return it->second;
}

void Speculator::observe(SequenceId seq, int64_t pos, std::span<const float> hidden, std::span<const int32_t> next) {
  if (!drafter_->needs_hidden()) return;
  const int64_t H = runner_.config().hidden_size;
  FATHOM_CHECK(int64_t(hidden.size()) == int64_t(next.size()) * H, "Speculator::observe: ", hidden.size() / H,
               " hidden rows for ", next.size(), " tokens");
  SeqState& s = state(seq);
  if (s.length.retired) return;
  if (s.backlog_pos < 0) s.backlog_pos = pos;
  FATHOM_CHECK(s.backlog_pos + int64_t(s.backlog_next.size()) == pos, "Speculator::observe: rows at position ", pos,
               " do not follow the queued rows ending at ", s.backlog_pos + int64_t(s.backlog_next.size()));
  s.backlog_hidden.insert(s.backlog_hidden.end(), hidden.begin(), hidden.end());
  s.backlog_next.insert(s.backlog_next.end(), next.begin(), next.end());
}

void Speculator::flush_long_backlogs() {
  std::vector<SequenceId> long_ones;
  for (const auto& [id, s] : seqs_)
    if (int64_t(s.backlog_next.size()) > std::min(kBacklogCap, max_tokens_)) long_ones.push_back(id);
  flush(long_ones);
}

// Runs the queued rows of `ids` through the MTP layer: each forward takes at most one piece of
// each sequence (a piece must start where the MTP cache ends) and at most max_tokens_ tokens.
void Speculator::flush(const std::vector<SequenceId>& ids) {
  const int64_t H = runner_.config().hidden_size;
  struct Pending {
    SequenceId id;
    SeqState* s;
    int64_t done;  // rows already run
  };
  std::vector<Pending> todo;
  for (SequenceId id : ids)
    if (SeqState& s = state(id); !s.backlog_next.empty()) todo.push_back({id, &s, 0});
  while (!todo.empty()) {
    std::vector<DraftExtend> batch;
    int64_t budget = max_tokens_;
    size_t taken = 0;
    for (; taken < todo.size() && budget > 0; ++taken) {
      Pending& p = todo[taken];
      const int64_t n = std::min<int64_t>(int64_t(p.s->backlog_next.size()) - p.done, budget);
      batch.push_back(DraftExtend{p.id, p.s->backlog_pos + p.done,
                                  std::span<const float>(p.s->backlog_hidden.data() + p.done * H, size_t(n * H)),
                                  std::span<const int32_t>(p.s->backlog_next.data() + p.done, size_t(n))});
      p.done += n;
      budget -= n;
    }
    drafter_->extend(batch);
    std::vector<Pending> rest;
    for (Pending& p : todo) {
      if (p.done < int64_t(p.s->backlog_next.size())) {
        rest.push_back(p);
      } else {
        p.s->drop_backlog();
      }
    }
    todo.swap(rest);
  }
}

void Speculator::propose(std::span<DraftRequest> batch) {
  std::vector<SequenceId> drafting;
  for (DraftRequest& r : batch) {
    r.drafts.clear();
    const int k = policy_.next(state(r.seq).length);
    r.max_drafts = std::max(0, std::min(r.max_drafts, k));
    if (r.max_drafts > 0) drafting.push_back(r.seq);
  }
  if (drafting.empty()) return;
  if (drafter_->needs_hidden()) flush(drafting);
  drafter_->propose(batch);
  for (DraftRequest& r : batch)
    if (int(r.drafts.size()) > r.max_drafts) r.drafts.resize(size_t(r.max_drafts));
}

int Speculator::draft_budget(SequenceId seq, int max_drafts) {
  return std::max(0, std::min(max_drafts, policy_.next(state(seq).length)));
}

int Speculator::peek_draft_budget(SequenceId seq, int max_drafts) const {
  auto it = seqs_.find(seq);
  const int k = it == seqs_.end() ? policy_.peek(policy_.start()) : policy_.peek(it->second.length);
  return std::max(0, std::min(max_drafts, k));
}

bool Speculator::retired(SequenceId seq) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.length.retired;
}

void Speculator::trace_draft(SequenceId seq, int64_t pos, int32_t draft) {
  if (!opt_.mtp_trace || opt_.algorithm != SpecAlgorithm::Mtp) return;
  static_cast<MtpDrafter*>(drafter_.get())->trace.push_back({seq, pos, draft});
}

void Speculator::record(SequenceId seq, int drafted, int accepted) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState& s = it->second;
  policy_.update(s.length, drafted, accepted);
  if (s.length.retired) s.drop_backlog();
}

void Speculator::release(SequenceId seq) {
  seqs_.erase(seq);
  drafter_->release(seq);
}

}  // namespace fathom
