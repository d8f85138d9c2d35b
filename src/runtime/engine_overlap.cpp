// The serving engine's overlapped scheduling (Engine, engine.h): step N+1 planned and launched
// while step N runs on the device, grammar masks that need N's tokens supplied once they are read.
#include <cstdio>
#include <functional>

#include "core/thread_pool.h"
#include "grammar/matcher.h"
#include "runtime/engine.h"

namespace fathom {

bool Engine::decodes_certainly_end(const Request& r, int64_t out_pos) const {
  return out_pos + 1 - r.num_prompt >= r.spec.params.max_tokens || out_pos + 1 >= cfg_.max_model_len;
}

bool Engine::penalties_running() const {
  for (const auto& [r, up] : live_) {
    const SamplingParams& sp = r->spec.params.sampling;
    if (sp.presence_penalty != 0.f || sp.frequency_penalty != 0.f || sp.repetition_penalty != 1.f) return true;
  }
  return false;
}

// Overlapped scheduling: step N+1 is planned and launched while step N runs on the device, its
// decode inputs being N's tokens still on the device (kPendingToken placeholders); then N's
// results are read and processed (detokenization, stop checks, streaming) while N+1 runs. A
// sequence that N ends wastes its row of N+1. Steps that might preempt, and requests whose
// penalties depend on the tokens N produces, wait for N instead. A grammar's mask for N+1 needs
// N's token: N+1's forward is queued with its sampler waiting, and the masks are computed once
// N's tokens are read (while N+1's forward runs), then handed to the runner (XGrammar's overlap).
bool Engine::step_overlapped() {
  InflightStep next;
  SchedulerOutput plan;
  if (sched_.has_work() && (!inflight_.active || !penalties_running())) {
    take_snapshots();
    plan = sched_.schedule(/*allow_preemption=*/!inflight_.active);
    finish_ended_at_admission();
    for (Request* p : plan.preempted) forget_sequence(*p);
    {
      std::lock_guard<std::mutex> l(metrics_mu_);
      metrics_.preemptions += plan.preempted.size();
    }
  }
  bool constrained = false;
  for (const ScheduledChunk& c : plan.chunks) constrained = constrained || c.req->matcher != nullptr;
  // Masks after N's tokens: deferred when the runner can take them later, else N+1 waits for N.
  const bool after_inflight = constrained && inflight_.active;
  const bool defer = after_inflight && plan.num_tokens <= runner_->deferred_mask_tokens();
  if (!plan.chunks.empty() && (!after_inflight || defer)) next = launch_overlapped(plan, defer);
  bool worked = next.active || inflight_.active;
  if (inflight_.active) {
    const bool decode_only = inflight_.decode_only;
    const int batch = int(inflight_.chunks.size());
    finish_overlapped(inflight_);
    time_plain_step(decode_only, batch);
  }
  if (after_inflight && !defer) {  // N's requests may have ended: only live ones run
    std::erase_if(plan.chunks, [&](const ScheduledChunk& c) { return !live_.count(c.req); });
    if (!plan.chunks.empty()) next = launch_overlapped(plan, false);
    worked = worked || next.active;
  }
  if (next.active && next.masks_deferred) supply_deferred_masks(next);
  plain_timed_ = plain_timed_ && next.active;  // an idle gap is no step's time
  inflight_ = std::move(next);
  return worked;
}

Engine::InflightStep Engine::launch_overlapped(const SchedulerOutput& plan, bool defer_masks) {
  InflightStep in;
  std::vector<ForwardStep> steps;
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.req;
    start_sequence(r);
    if (spec_ && !r.spec_off) {  // no hidden states in this step: the MTP layer falls behind for good
      spec_->release(r.seq);
      r.spec_off = true;
      r.next_draft = -1;
      r.drafts.clear();
    }
    steps.push_back(ForwardStep{r.seq, std::span<const int32_t>(r.tokens.data() + r.num_computed, size_t(c.num_tokens))});
  }
  add_sampling_rows(plan.chunks, steps, defer_masks);
  if (!guarded_forward(plan.chunks, [&] {
        runner_->launch_sampled(steps, sampling_rows_.rows(), sampling_rows_.adjustments(), sampling_rows_.masks(),
                                defer_masks);
      }))
    return in;
  in.active = true;
  in.masks_deferred = defer_masks;
  in.decode_only = true;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Request* r = plan.chunks[i].req;
    r->num_computed += plan.chunks[i].num_tokens;
    int64_t out_pos = -1;  // a prefill chunk before the prompt's end samples nothing
    in.decode_only = in.decode_only && plan.chunks[i].num_tokens == 1 && r->num_output() > 0;
    if (r->num_computed == int64_t(r->tokens.size())) {
      out_pos = int64_t(r->tokens.size());
      if (!decodes_certainly_end(*r, out_pos)) r->tokens.push_back(kPendingToken);
    }
    // A prompt's end: its state now (the runner orders this copy after the step, before the next
    // one), cached with the row's logits once the step is read.
    const int64_t end_snapshot = sampling_rows_.rows()[i].keep_logits ? save_snapshot(*r) : 0;
    in.chunks.push_back({r, r->seq, out_pos, sampling_rows_.rows()[i].mask_row, end_snapshot});
  }
  return in;
}

// The grammar masks of a launched step, now that the step before it has been read: each live
// constrained row's mask after its output so far (rows whose request ended keep the placeholder;
// nobody reads them).
void Engine::supply_deferred_masks(const InflightStep& in) {
  const int64_t words = mask_words(runner_->config().vocab_size);
  std::vector<const InflightChunk*> rows;
  for (const InflightChunk& c : in.chunks)
    if (c.mask_row >= 0 && live_.count(c.req) && c.req->seq == c.seq && c.req->matcher) rows.push_back(&c);
  // Each request its own matcher (the compiled grammar they share is thread-safe): a state met
  // for the first time costs up to ~0.3 ms, so the rows run on the thread pool.
  try {
    parallel_for(int64_t(rows.size()), 1, [&](int64_t begin, int64_t end) {
      std::vector<uint32_t> scratch;
      for (int64_t i = begin; i < end; ++i) {
        Request& r = *rows[size_t(i)]->req;
        uint32_t* dst = sampling_rows_.mask(rows[size_t(i)]->mask_row);
        const size_t need = r.matcher->vocab().mask_words();
        if (need <= size_t(words)) {
          r.matcher->fill_next_token_bitmask(std::span<uint32_t>(dst, size_t(words)));
        } else {
          scratch.assign(need, 0u);
          r.matcher->fill_next_token_bitmask(scratch);
          std::copy_n(scratch.begin(), words, dst);
        }
      }
    });
  } catch (const std::exception& e) {  // the sampler still gets its masks below: the runner must not wait on
    for (const InflightChunk* c : rows)  // a step that never comes
      if (live_.count(c->req)) fail_request(*c->req, "grammar", e.what());
  }
  try {
    runner_->supply_masks(sampling_rows_.masks());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine: sampling failed: %s\n", e.what());
    for (const InflightChunk& c : in.chunks)
      if (live_.count(c.req) && c.req->seq == c.seq) fail_request(*c.req, "forward", e.what());
  }
}

void Engine::finish_overlapped(InflightStep& in) {
  SampledOutput so;
  try {
    so = runner_->finish_sampled();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine: forward failed: %s\n", e.what());
    for (const InflightChunk& c : in.chunks) {
      if (c.end_snapshot) runner_->drop_snapshot(c.end_snapshot);
      if (live_.count(c.req) && c.req->seq == c.seq) fail_request(*c.req, "forward", e.what());
    }
    in.active = false;
    return;
  }
  in.active = false;
  StepResult res;
  res.so = &so;
  const auto now = Clock::now();
  const int64_t vocab = runner_->config().vocab_size;
  for (size_t i = 0; i < in.chunks.size(); ++i) {
    const InflightChunk& c = in.chunks[i];
    Request& r = *c.req;
    const bool live = live_.count(c.req) && r.seq == c.seq;
    if (c.end_snapshot) {  // the prompt's end, with its row's logits (r's prompt: while r lives)
      const float* logits = so.kept_row_logits(so.row_begin[i], vocab);
      if (live && logits) cache_prompt_end(r, c.end_snapshot, logits, nullptr);
      else runner_->drop_snapshot(c.end_snapshot);
    }
    if (c.out_pos < 0 || !live) continue;  // ended meanwhile, or mid-prompt
    try {
      if (c.out_pos > r.num_prompt) ++r.decode_steps;  // not the prompt's first token
      TokenLogprob lp;
      const Acceptance acc = pick(r, res, so.row_begin[i], nullptr, lp);
      const std::string reason =
          process_token(r, c.out_pos, acc.token, r.spec.params.logprobs >= 0 ? &lp : nullptr, now);
      if (!reason.empty()) finish(r, reason);
    } catch (const RequestError& e) {
      fail_request(r, e.stage(), e.what());
    } catch (const std::exception& e) {
      fail_request(r, "postprocess", e.what());
    }
  }
}

}  // namespace fathom
