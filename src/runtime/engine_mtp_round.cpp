// Fused MTP rounds in the serving engine (issue 34). A speculative round otherwise takes two
// launches and two host round trips: the MTP draft step (Speculator::propose), then the verify
// step. When every sequence of a step decodes one draft a round with its MTP layer caught up,
// the step runs ModelRunner::forward_verify_draft: the verify rows, each row's token chosen where
// the logits are, then the MTP layer over the same rows with those tokens, in one launch. Plain
// greedy rows take the argmax; with device sampling any other decode (temperature, penalties,
// logit bias, min_tokens, logprobs, a grammar) takes the round's sampling rows, its draft
// verified by rejection sampling on the device (lossless in distribution: accepted with p(draft),
// else drawn from p without it). The MTP row after the last accepted token is the next round's
// draft (kept in Request::next_draft), so the MTP layer stays caught up and the next round needs
// no draft step. A step that cannot be fused (a sequence prefilling, or sampling on the host)
// runs as usual: its drafts are verified as any drafts are, and the sequence drafts through the
// speculator again.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "runtime/engine.h"

namespace fathom {

bool fused_mtp_rounds_enabled() {  // FATHOM_FUSED_MTP=0 turns them off (A/B runs)
  static const bool on = [] {
    const char* v = std::getenv("FATHOM_FUSED_MTP");
    return !v || std::string(v) != "0";
  }();
  return on;
}

// Output blocks between the conversation snapshots a chain of rounds stops for.
constexpr int64_t kChainSnapshotBlocks = 4;

bool chained_rounds_enabled() {  // FATHOM_CHAINED_ROUNDS=0 turns them off (A/B runs)
  static const bool on = [] {
    const char* v = std::getenv("FATHOM_CHAINED_ROUNDS");
    return !v || std::string(v) != "0";
  }();
  return on;
}

bool Engine::plain_greedy(const Request& r) const {
  const RequestParams& p = r.spec.params;
  const bool min_tokens_mask = r.num_output() < p.min_tokens && (!eos_.empty() || !p.stop_token_ids.empty());
  return p.sampling.temperature <= 0.f && !r.sampler.adjusts_logits() && !r.matcher && p.logprobs < 0 &&
         !min_tokens_mask;
}

bool Engine::fused_round_eligible(const Request& r) const {
  return r.spec.params.fault.site == FaultSite::None && (device_sampling_ || plain_greedy(r));
}

bool Engine::fused_round_possible(const SchedulerOutput& plan) const {
  if (!fused_rounds_ || plan.chunks.empty()) return false;
  for (const ScheduledChunk& c : plan.chunks) {
    const Request& r = *c.req;
    const bool decoding = r.seq && r.num_output() > 0 && r.num_computed == int64_t(r.tokens.size()) - 1;
    // Drafting this round, or keeping the next round's draft (a back-off round verifies none);
    // a sequence that drafts nothing at all (retired, or over the batch-size limit) runs plain.
    const bool drafting = !r.drafts.empty() || r.next_draft >= 0;
    if (!decoding || !drafting || !fused_round_eligible(r) || c.num_tokens != 1 + int64_t(r.drafts.size()) ||
        runner_->mtp_length(r.seq) != r.num_computed)
      return false;
  }
  return true;
}

void Engine::run_fused_round(const SchedulerOutput& plan, const StepTiming& timing) {
  InflightRound in = launch_round(plan.chunks, /*chained=*/false, timing);
  if (!in.active) return;
  if (in.has_out) finish_round(in, /*next_chained=*/false);
  else round_ = std::move(in);  // read in the next step, maybe after launching its successor
}

// A fused round of `chunks`: launched (chained rounds on), else run at once. Chained: each
// sequence's tokens and its draft are those the round in flight leaves (ModelRunner::
// launch_verify_draft), its rows drawing past the one token that round surely gives.
Engine::InflightRound Engine::launch_round(const std::vector<ScheduledChunk>& chunks, bool chained,
                                           const StepTiming& timing) {
  static constexpr int32_t kFromRound[2] = {kPendingToken, kPendingToken};
  std::vector<ForwardStep> steps;
  steps.reserve(chunks.size());
  bool sampled = false;  // some row needs more than the argmax of its raw logits
  for (const ScheduledChunk& c : chunks) {
    Request& r = *c.req;
    if (chained) {
      steps.push_back(ForwardStep{r.seq, kFromRound, /*all_rows=*/true, /*keep_history=*/true});
    } else {
      r.step_tokens.assign(1, r.tokens.back());
      r.step_tokens.insert(r.step_tokens.end(), r.drafts.begin(), r.drafts.end());
      steps.push_back(ForwardStep{r.seq, r.step_tokens, /*all_rows=*/true, /*keep_history=*/true});
    }
    sampled = sampled || !plain_greedy(r);
  }
  InflightRound in;
  const bool ran = guarded_forward(chunks, [&] {
    if (sampled && chained) {
      sampling_rows_.clear();
      for (const ScheduledChunk& c : chunks) {
        sampling_rows_.add(*c.req, {}, kDraftFromRound, eos_, nullptr, /*unread=*/1);
        sampling_rows_.add(*c.req, {}, -1, eos_, nullptr, /*unread=*/2);  // the row after the draft
      }
    } else if (sampled) {
      add_sampling_rows(chunks, steps);
    }
    if (sampled && draw_drafts_) {  // sampled requests' rows: their next drafts drawn from q
      size_t row = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const size_t n = steps[i].tokens.size();
        if (chunks[i].req->spec.params.sampling.temperature > 0.f) sampling_rows_.draw_drafts(row, row + n);
        row += n;
      }
    }
    const std::span<const RowSampling> rows = sampled ? sampling_rows_.rows() : std::span<const RowSampling>{};
    if (chained_rounds_ && (!sampled || runner_->chains_sampled_rounds())) {
      runner_->launch_verify_draft(steps, rows, sampling_rows_.adjustments(), sampling_rows_.masks());
    } else {
      in.out = runner_->forward_verify_draft(steps, rows, sampling_rows_.adjustments(), sampling_rows_.masks());
      in.has_out = true;
    }
  });
  if (!ran) {
    for (auto& [r, up] : live_) r->drafts.clear(), r->next_draft = -1;
    return in;
  }
  in.active = true;
  in.chunks = chunks;
  for (const ScheduledChunk& c : chunks) in.seqs.push_back(c.req->seq);
  in.timing = timing;
  std::lock_guard<std::mutex> l(metrics_mu_);
  ++metrics_.spec_fused_rounds;
  metrics_.spec_chained_rounds += chained ? 1 : 0;
  return in;
}

// Round N in flight: round N + 1 launched first where every running sequence may go on, then N read.
bool Engine::step_chained_round() {
  bool chain = sched_.num_waiting() == 0 && speculative_step() && round_.chunks.size() == sched_.num_running();
  for (size_t i = 0; i < round_.chunks.size() && chain; ++i) {
    Request* r = round_.chunks[i].req;
    chain = live_.count(r) && r->seq == round_.seqs[i] && chain_eligible(*r);
  }
  InflightRound next;
  if (chain) {
    std::vector<ScheduledChunk> chunks = round_.chunks;
    for (ScheduledChunk& c : chunks) {
      c.num_tokens = 2;
      spec_->draft_budget(c.req->seq, 1);  // this round's, peeked at above
    }
    next = launch_round(chunks, /*chained=*/true, StepTiming{});
  }
  finish_round(round_, next.active);
  if (next.active && round_.timing.timed) {  // timed from this finish on, as plain overlapped steps are
    next.timing = round_.timing;
    next.timing.start = Clock::now();
    std::lock_guard<std::mutex> l(metrics_mu_);
    next.timing.tokens_before = metrics_.generation_tokens;
  }
  round_ = std::move(next);
  return true;
}

// Whether r's next round may be launched before the one in flight is read: a fused round whose
// rows do not depend on that round's tokens (no penalties, grammar or min_tokens mask), with room
// for both rounds' tokens within max_tokens, the context and the KV blocks, and no conversation
// snapshot due where the round in flight may end (they are taken between rounds: with chained
// rounds every kChainSnapshotBlocks blocks of output, as a chain at every block boundary would
// break one round in eight).
bool Engine::chain_eligible(Request& r) {
  const RequestParams& p = r.spec.params;
  const SamplingParams& sp = p.sampling;
  // Sampled rows chain only where the draft decisions cannot depend on the chain: with the
  // adaptive length on, a chained round's budget is taken a round early, and whether a round
  // chains depends on other requests' arrivals, so a seeded request's draws would too (greedy
  // outputs do not depend on the drafts).
  const bool sampled = !plain_greedy(r);
  if (sampled && (!runner_->chains_sampled_rounds() || !spec_ || spec_->options().adaptive)) return false;
  if (!fused_round_eligible(r) || r.matcher || r.drafts.size() != 1 || !spec_ || spec_->retired(r.seq) ||
      sp.presence_penalty != 0.f || sp.frequency_penalty != 0.f || sp.repetition_penalty != 1.f ||
      r.num_output() + 1 < p.min_tokens)
    return false;
  // Round N gives 1-2 tokens and N + 1 needs room for a draft after them (as propose_drafts).
  if (r.num_output() + 4 > p.max_tokens || int64_t(r.tokens.size()) + 3 > cfg_.max_model_len) return false;
  if (prefix_cache_)
    for (int64_t at : {r.num_computed + 1, r.num_computed + 2})
      if (at % (kChainSnapshotBlocks * cfg_.block_size) == 0 && at > r.turn_snapshot_len && turn_room_for(r, at))
        return false;
  // The round's draft budget is taken when the chain launches (once a round, as propose_drafts).
  return spec_->peek_draft_budget(r.seq, 1) > 0 && blocks_.grow(r.block_table, r.num_computed + 4);
}

// Reads a fused round (its output kept, or the oldest launched round): each live sequence takes
// its tokens; with next_chained the round after it is already running from them.
void Engine::finish_round(InflightRound& in, bool next_chained) {
  in.active = false;
  VerifyDraftOutput out;
  if (in.has_out) {
    out = std::move(in.out);
  } else {
    try {
      out = runner_->finish_verify_draft();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "engine: forward failed: %s\n", e.what());
      for (size_t i = 0; i < in.chunks.size(); ++i)
        if (live_.count(in.chunks[i].req) && in.chunks[i].req->seq == in.seqs[i])
          fail_request(*in.chunks[i].req, "forward", e.what());
      return;
    }
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < in.chunks.size(); ++i) {
    Request& r = *in.chunks[i].req;
    if (!live_.count(&r) || r.seq != in.seqs[i]) continue;  // ended meanwhile
    try {
      finish_fused_round(r, out, i, now, next_chained);
    } catch (const RequestError& e) {
      fail_request(r, e.stage(), e.what());
    } catch (const std::exception& e) {
      fail_request(r, "postprocess", e.what());
    }
  }
  end_speculative_timing(in.timing);
}

// As finish_chunk for a verify step, with the tokens the round chose on the device.
void Engine::finish_fused_round(Request& r, const VerifyDraftOutput& out, size_t i, Clock::time_point now,
                                bool next_chained) {
  const SequenceId seq = r.seq;
  const int nd = int(r.drafts.size());
  const int64_t row = out.row_begin[i];
  r.num_computed += 1 + nd;
  int accepted = 0;
  std::string reason;
  const int n_logprobs = r.spec.params.logprobs;
  for (int d = 0; d <= nd && reason.empty(); ++d) {
    const size_t at = size_t(row + d);
    const int32_t token = out.target[at];
    const bool hit = d < nd && (out.samples.empty() ? token == r.drafts[size_t(d)] : out.samples[at].accepted != 0);
    accepted += hit ? 1 : 0;
    TokenLogprob lp;
    if (n_logprobs >= 0) lp = device_logprob(out.samples[at], out.top_ids, out.top_logprobs, int64_t(at), n_logprobs);
    reason = process_token(r, int64_t(r.tokens.size()), token, n_logprobs >= 0 ? &lp : nullptr, now);
    if (d < nd && !hit) break;
  }
  record_round(r, nd, accepted);
  if (!reason.empty()) {
    finish(r, reason);  // frees r
    return;
  }
  // The model and the MTP layer both took every row; both keep the pending token and the accepted
  // drafts (a chained round's runner rolled them back itself). The MTP row of the last kept
  // position drafts the next round, which verifies it already when chained.
  r.num_computed = int64_t(r.tokens.size()) - 1;
  if (accepted < nd && !next_chained) {
    runner_->rollback(seq, r.num_computed);
    runner_->mtp_rollback(seq, r.num_computed);
  }
  blocks_.shrink(r.block_table, r.num_computed + (next_chained ? 2 : 0));
  r.next_draft = out.draft[size_t(row + accepted)];
  spec_->trace_draft(seq, r.num_computed - 1, r.next_draft);
  r.drafts.clear();
  if (next_chained) r.drafts.assign(1, r.next_draft);
}

}  // namespace fathom
