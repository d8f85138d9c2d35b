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

void Engine::run_fused_round(const SchedulerOutput& plan) {
  std::vector<ForwardStep> steps;
  steps.reserve(plan.chunks.size());
  bool sampled = false;  // some row needs more than the argmax of its raw logits
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.req;
    r.step_tokens.assign(1, r.tokens.back());
    r.step_tokens.insert(r.step_tokens.end(), r.drafts.begin(), r.drafts.end());
    steps.push_back(ForwardStep{r.seq, r.step_tokens, /*all_rows=*/true, /*keep_history=*/true});
    sampled = sampled || !plain_greedy(r);
  }
  VerifyDraftOutput out;
  const bool ran = guarded_forward(plan.chunks, [&] {
    if (!sampled) {
      out = runner_->forward_verify_draft(steps);
      return;
    }
    add_sampling_rows(plan.chunks, steps);
    out = runner_->forward_verify_draft(steps, sampling_rows_.rows(), sampling_rows_.adjustments(),
                                        sampling_rows_.masks());
  });
  if (!ran) {
    for (auto& [r, up] : live_) r->drafts.clear(), r->next_draft = -1;
    return;
  }
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    ++metrics_.spec_fused_rounds;
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Request& r = *plan.chunks[i].req;
    try {
      finish_fused_round(r, out, i, now);
    } catch (const RequestError& e) {
      fail_request(r, e.stage(), e.what());
    } catch (const std::exception& e) {
      fail_request(r, "postprocess", e.what());
    }
  }
}

// As finish_chunk for a verify step, with the tokens the round chose on the device.
void Engine::finish_fused_round(Request& r, const VerifyDraftOutput& out, size_t i, Clock::time_point now) {
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
  // drafts. The MTP row of the last kept position drafts the next round.
  r.num_computed = int64_t(r.tokens.size()) - 1;
  if (accepted < nd) {
    runner_->rollback(seq, r.num_computed);
    runner_->mtp_rollback(seq, r.num_computed);
  }
  blocks_.shrink(r.block_table, r.num_computed);
  r.next_draft = out.draft[size_t(row + accepted)];
  spec_->trace_draft(seq, r.num_computed - 1, r.next_draft);
  r.drafts.clear();
}

}  // namespace fathom
