// The serving engine's step (Engine, engine.h): requests in, a plan from the scheduler, one
// forward, its outputs handed to each request (engine_output.cpp). Overlapped steps are in
// engine_overlap.cpp, prefix admission in engine_prefix.cpp, metrics in engine_metrics.cpp.
#include "runtime/engine.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace fathom {

// KV blocks to account: what the runner was sized for when it says (the CUDA engine: from device
// memory or --num-kv-blocks), else --num-kv-blocks or room for max_num_seqs full sequences.
static int64_t num_blocks(const EngineConfig& c, const ModelRunner& r) {
  const int64_t per_seq = (c.max_model_len + c.block_size - 1) / c.block_size;
  if (const int64_t cap = r.kv_capacity_tokens(); cap > 0) {
    FATHOM_CHECK(r.max_sequence_length() <= 0 || c.max_model_len <= r.max_sequence_length(), "max-model-len ",
                 c.max_model_len, " exceeds the longest sequence the engine holds (", r.max_sequence_length(),
                 " tokens of KV cache or block table)");
    FATHOM_CHECK(r.max_sequences() <= 0 || c.max_num_seqs <= r.max_sequences(), "max-num-seqs ", c.max_num_seqs,
                 " exceeds the engine's ", r.max_sequences(), " sequence slots");
    return cap / c.block_size;
  }
  return c.num_kv_blocks > 0 ? std::max(c.num_kv_blocks, per_seq) : per_seq * c.max_num_seqs;
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, const tok::Tokenizer* tokenizer, EngineConfig cfg)
    : Engine(*runner, tokenizer, std::move(cfg)) {
  owned_runner_ = std::move(runner);
}

Engine::Engine(ModelRunner& runner, const tok::Tokenizer* tokenizer, EngineConfig cfg)
    : runner_(&runner),
      tok_(tokenizer),
      cfg_(cfg),
      blocks_(num_blocks(cfg, *runner_), cfg.block_size),
      slots_(cfg.max_num_seqs),
      sched_(SchedulerConfig{cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_prefill_tokens,
                             /*align_chunks=*/false, cfg.max_chunk_tokens},
             blocks_, slots_),
      eos_(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end()),
      device_sampling_(cfg.device_sampling && runner_->samples_on_device()),
      sampling_rows_(runner_->config().vocab_size) {
  overlap_ = device_sampling_ && cfg.overlap_schedule && runner_->supports_pending_tokens();
  FATHOM_CHECK(cfg.max_num_batched_tokens > 0, "--max-num-batched-tokens must be positive");
  if (cfg.spec.algorithm != SpecAlgorithm::None)
    spec_ = std::make_unique<Speculator>(*runner_, cfg.spec,
                                         cfg.max_chunk_tokens > 0 ? cfg.max_chunk_tokens : cfg.max_num_batched_tokens);
  fused_rounds_ = cfg.spec.algorithm == SpecAlgorithm::Mtp && cfg.spec.num_steps == 1 &&
                  runner_->supports_fused_mtp_round() && cfg.fused_mtp_rounds && fused_mtp_rounds_enabled();
  chained_rounds_ = fused_rounds_ && overlap_ && cfg.chained_mtp_rounds && runner_->supports_chained_rounds() &&
                    chained_rounds_enabled();
  if (cfg.spec.sampled_drafts) {
    FATHOM_CHECK(fused_rounds_ && device_sampling_, "--speculative-sampled-drafts needs fused MTP rounds "
                 "(--speculative-algorithm mtp --speculative-num-steps 1) and the device sampler");
    FATHOM_CHECK(runner_->draws_sampled_drafts(), "--speculative-sampled-drafts: the ", runner_->device_name(),
                 " engine draws no sampled drafts yet");
    draw_drafts_ = true;
  }
  if (cfg.enable_prefix_caching && runner_->supports_snapshots()) {
    FATHOM_CHECK(cfg.prefix_cache_interval >= 0, "--prefix-cache-interval must not be negative");
    prefix_cache_ = std::make_unique<PrefixCache>(cfg.block_size, cfg.prefix_cache_bytes);
    sched_.set_admit_hook([this](Request& r) { return admit(r); });
    sched_.set_align_chunks(true);
    prompt_end_snapshots_ = !device_sampling_ || runner_->returns_kept_logits();
    FATHOM_CHECK(cfg.prefix_cache_host_bytes >= 0, "--prefix-cache-host-gb must not be negative");
    if (cfg.prefix_cache_host_bytes > 0) {
      FATHOM_CHECK(runner_->supports_host_snapshots(), "--prefix-cache-host-gb: the ", runner_->device_name(),
                   " engine keeps no prefix snapshots in host memory (no host tier yet)");
      host_cache_ = std::make_unique<PrefixCache>(cfg.block_size, cfg.prefix_cache_host_bytes);
      runner_->set_host_snapshot_budget(cfg.prefix_cache_host_bytes);
    }
  }
  stat_blocks_free_ = blocks_.num_free();
  for (const char* r : {"stop", "length", "abort", "error"}) metrics_.finished[r] = 0;
  for (const char* st : {"sample", "detokenize", "stop", "forward", "postprocess"}) metrics_.errors[st] = 0;
}

Engine::~Engine() {
  shutdown();
  // A borrowed runner goes back without this engine's snapshots.
  if (prefix_cache_)
    for (const PrefixCache::Removed& e : prefix_cache_->clear()) runner_->drop_snapshot(e.snapshot);
  if (host_cache_)
    for (const PrefixCache::Removed& e : host_cache_->clear()) runner_->drop_host_snapshot(e.snapshot);
}

void Engine::start() { thread_ = std::thread([this] { loop(); }); }

void Engine::shutdown() {
  stopping_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Engine::SubmitResult Engine::submit(std::vector<RequestSpec> specs) {
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return SubmitResult::ShuttingDown;
    if (int64_t(inbox_.size()) + stat_waiting_.load() + int64_t(specs.size()) > cfg_.max_queue_len)
      return SubmitResult::QueueFull;
    for (auto& s : specs) {
      auto r = std::make_unique<Request>(std::move(s), now);
      if (r->spec.params.grammar) r->matcher = std::make_shared<grammar::Matcher>(r->spec.params.grammar);
      inbox_.push_back(std::move(r));
    }
  }
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    ++metrics_.requests_received;
  }
  cv_.notify_one();
  return SubmitResult::Ok;
}

void Engine::abort(uint64_t group) {
  {
    std::lock_guard<std::mutex> l(mu_);
    aborts_.push_back(group);
  }
  cv_.notify_one();
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Request>> in;
  std::vector<uint64_t> ab;
  {
    std::lock_guard<std::mutex> l(mu_);
    in.swap(inbox_);
    ab.swap(aborts_);
    // Count the new requests as waiting right away so that admission control stays tight.
    stat_waiting_ += int(in.size());
  }
  for (auto& up : in) {
    Request* r = up.get();
    if (tok_ && r->spec.params.detokenize)
      r->detok = std::make_unique<tok::DecodeStream>(*tok_, r->spec.params.skip_special_tokens);
    by_group_.emplace(r->spec.group, r);
    live_.emplace(r, std::move(up));
    sched_.add(r);
  }
  for (uint64_t g : ab) {
    auto range = by_group_.equal_range(g);
    std::vector<Request*> victims;
    for (auto it = range.first; it != range.second; ++it) victims.push_back(it->second);
    for (Request* r : victims) {
      r->pending.finished = true;
      flush(*r, true, "abort");
      drop(r);
    }
  }
}

void Engine::drop(Request* r) {
  sched_.remove(r);
  retire_turn_snapshot(*r);
  if (r->seq && spec_) spec_->release(r->seq);
  if (r->seq) runner_->remove_sequence(r->seq);
  r->seq = 0;
  auto range = by_group_.equal_range(r->spec.group);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == r) {
      by_group_.erase(it);
      break;
    }
  live_.erase(r);
}

void Engine::add_sampling_rows(const std::vector<ScheduledChunk>& chunks, const std::vector<ForwardStep>& steps,
                               bool defer_masks) {
  sampling_rows_.clear();
  const int64_t vocab = runner_->config().vocab_size;
  if (defer_masks) {  // every grammar row gets a placeholder, replaced by supply_deferred_masks()
    all_allowed_.assign(size_t(mask_words(vocab)), ~0u);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Request& r = *chunks[i].req;
      if (r.num_computed + int64_t(steps[i].tokens.size()) < int64_t(r.tokens.size())) {
        sampling_rows_.add_skip();
        continue;
      }
      sampling_rows_.add(r, {}, -1, eos_, r.matcher ? all_allowed_.data() : nullptr);
      if (wants_prompt_end(r)) sampling_rows_.keep_last_logits();
    }
    return;
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Request& r = *chunks[i].req;
    if (steps[i].all_rows) {  // draft verification: the pending token's row, then one per draft
      const std::span<const int32_t> drafts(r.drafts);
      size_t taken = 0;  // drafts the matcher holds; a draft it refuses ends the chain there (its row
      bool valid = true;  // rejects it, so later rows are never read)
      for (size_t d = 0; d <= drafts.size(); ++d) {
        if (r.matcher && d > 0 && valid) {
          valid = r.matcher->accept_token(uint32_t(drafts[d - 1]));
          taken += valid ? 1 : 0;
        }
        sampling_rows_.add(r, drafts.first(d), d < drafts.size() ? drafts[d] : -1, eos_, grammar_mask(r, vocab));
      }
      if (taken > 0) r.matcher->rollback(taken);
    } else if (r.num_computed + int64_t(steps[i].tokens.size()) >= int64_t(r.tokens.size())) {
      sampling_rows_.add(r, {}, -1, eos_, grammar_mask(r, vocab));
      if (wants_prompt_end(r)) sampling_rows_.keep_last_logits();
    } else {
      sampling_rows_.add_skip();  // a prefill chunk before the prompt's end
    }
  }
}

// Drafts for every running sequence that is decoding (all its tokens but the last consumed),
// capped so the round can neither overshoot max_tokens nor the context. A sequence whose last
// round was fused drafts the token that round's MTP row made (engine_mtp_round.cpp).
void Engine::propose_drafts() {
  std::vector<DraftRequest> reqs;
  std::vector<Request*> who, fused;
  for (auto& [r, up] : live_) {
    r->drafts.clear();
    if (r->status != RequestStatus::Running || !r->seq || r->spec_off || r->num_output() == 0 ||
        r->num_computed != int64_t(r->tokens.size()) - 1)
      continue;
    const int64_t room = std::min<int64_t>(r->spec.params.max_tokens - r->num_output() - 1,
                                           cfg_.max_model_len - int64_t(r->tokens.size()));
    const int k = int(std::clamp<int64_t>(room, 0, spec_->max_drafts()));
    if (r->next_draft >= 0 && !spec_->retired(r->seq)) {
      if (spec_->draft_budget(r->seq, k) > 0) r->drafts.assign(1, r->next_draft);
      fused.push_back(r);
      continue;
    }
    r->next_draft = -1;
    reqs.push_back(DraftRequest{r->seq, r->tokens, k, {}});
    who.push_back(r);
  }
  const int limit = spec_->options().disable_by_batch_size;
  if (limit > 0 && int(reqs.size() + fused.size()) >= limit) {  // no drafts, no fused rounds
    for (Request* r : fused) r->drafts.clear(), r->next_draft = -1;
    return;
  }
  if (reqs.empty()) return;
  spec_->propose(reqs);
  for (size_t i = 0; i < who.size(); ++i) who[i]->drafts = std::move(reqs[i].drafts);
}

// Runs a step's forward (after any injected forward fault). A SequenceError is raised before any
// state changed: that sequence ends, the others run again next step. Anything else may have left
// the batch's state half-updated: every sequence of it ends. False when the forward failed.
bool Engine::guarded_forward(const std::vector<ScheduledChunk>& chunks, const std::function<void()>& forward) {
  try {
    for (const ScheduledChunk& c : chunks)
      if (c.req->spec.params.fault.fires(FaultSite::Forward, c.req->num_output()))
        throw SequenceError(c.req->seq, "injected fault at forward (--enable-fault-injection)");
    forward();
    return true;
  } catch (const SequenceError& e) {
    for (const ScheduledChunk& c : chunks)
      if (c.req->seq == e.seq()) {
        fail_request(*c.req, "forward", e.what());
        break;
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "engine: forward failed: %s\n", e.what());
    for (const ScheduledChunk& c : chunks) fail_request(*c.req, "forward", e.what());
  }
  return false;
}

// Gives a newly scheduled request its engine sequence (and counts its queue time once).
void Engine::start_sequence(Request& r) {
  if (r.seq) return;
  r.seq = runner_->add_sequence();
  observe_queue(r);
}

// A preempted request's engine sequence goes (it starts afresh, drafting again).
void Engine::forget_sequence(Request& r) {
  if (r.seq && spec_) spec_->release(r.seq);
  if (r.seq) runner_->remove_sequence(r.seq);
  r.seq = 0;
  r.next_draft = -1;
  r.spec_off = false;
}

// Speculative when some sequence may still draft (or a new one arrives: its prefill must feed
// the MTP layer) and fewer than disable_by_batch_size sequences are running or waiting to (those
// waiting join this step: counted, a newcomer beside a running sequence at limit 2 starts plain,
// and at limit 1 no step is speculative, not even the first).
bool Engine::speculative_step() const {
  if (!spec_) return false;
  const int limit = auto_batch_limit() ? batch_limit_.limit() : spec_->options().disable_by_batch_size;
  int live = 0;
  bool may_draft = false;
  for (const auto& [r, up] : live_) {
    live += r->status != RequestStatus::Finished;
    may_draft = may_draft || (!r->spec_off && !(r->seq && spec_->retired(r->seq)));
  }
  return may_draft && (limit <= 0 || live < limit);
}

bool Engine::step() {
  drain_inbox();
  if (round_.active) return step_chained_round();
  if (overlap_ && !speculative_step()) return step_overlapped();
  if (overlap_ && inflight_.active) {  // back from overlapped steps: drafts need the tokens
    finish_overlapped(inflight_);
    return true;
  }
  if (!sched_.has_work()) return false;
  const auto step_start = Clock::now();
  if (spec_) propose_drafts();
  take_snapshots();
  SchedulerOutput plan = sched_.schedule();
  finish_ended_at_admission();
  for (Request* p : plan.preempted) forget_sequence(*p);
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.preemptions += plan.preempted.size();
    metrics_.spec_waiting_steps += spec_ && overlap_ && !plan.chunks.empty() ? 1 : 0;
  }
  if (plan.chunks.empty()) return false;
  for (const ScheduledChunk& c : plan.chunks) {  // a budget-cut chunk verifies fewer drafts
    Request* r = c.req;
    const int64_t pending = int64_t(r->tokens.size()) - r->num_computed;
    r->drafts.resize(size_t(std::clamp<int64_t>(c.num_tokens - pending, 0, int64_t(r->drafts.size()))));
  }
  const StepTiming timing = begin_speculative_timing(plan, step_start);
  if (fused_round_possible(plan)) {
    run_fused_round(plan, timing);
    return true;
  }

  const bool need_hidden = spec_ && spec_->needs_hidden();
  std::vector<ForwardStep> steps;
  std::vector<int64_t> len_before;
  steps.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    Request* r = c.req;
    start_sequence(*r);
    len_before.push_back(r->num_computed);
    if (!r->drafts.empty()) {
      r->step_tokens.assign(1, r->tokens.back());
      r->step_tokens.insert(r->step_tokens.end(), r->drafts.begin(), r->drafts.end());
      steps.push_back(ForwardStep{r->seq, r->step_tokens, /*all_rows=*/true, /*keep_history=*/true});
    } else {
      steps.push_back(ForwardStep{r->seq, std::span<const int32_t>(r->tokens.data() + r->num_computed, size_t(c.num_tokens)),
                                  /*all_rows=*/false, /*keep_history=*/false, /*all_hidden=*/need_hidden});
    }
  }
  ForwardOutput fo;
  SampledOutput so;
  StepResult res;
  const bool ran = guarded_forward(plan.chunks, [&] {
    if (device_sampling_) {
      add_sampling_rows(plan.chunks, steps);
      so = runner_->forward_sampled(steps, sampling_rows_.rows(), sampling_rows_.adjustments(), need_hidden,
                                    sampling_rows_.masks());
      res.so = &so;
    } else {
      fo = runner_->forward(steps);
      res.fo = &fo;
    }
  });
  if (!ran) {
    for (auto& [r, up] : live_) r->drafts.clear();
    return true;
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Request& r = *plan.chunks[i].req;
    try {
      finish_chunk(r, steps[i], res, i, len_before[i], now);
    } catch (const RequestError& e) {
      fail_request(r, e.stage(), e.what());
    } catch (const std::exception& e) {
      fail_request(r, "postprocess", e.what());
    }
  }
  if (spec_) spec_->flush_long_backlogs();
  end_speculative_timing(timing);
  return true;
}

// A speculative step is timed from its start (the draft step and the host's work are its cost)
// when it decodes only and verifies drafts.
Engine::StepTiming Engine::begin_speculative_timing(const SchedulerOutput& plan, Clock::time_point start) {
  plain_timed_ = false;
  StepTiming t{start, 0, int(plan.chunks.size()), false};
  if (!auto_batch_limit()) return t;
  bool decode_only = true, drafting = false;
  for (const ScheduledChunk& c : plan.chunks) {
    const Request& r = *c.req;
    decode_only = decode_only && r.num_output() > 0 && int64_t(r.tokens.size()) - r.num_computed == 1;
    drafting = drafting || !r.drafts.empty();
  }
  t.timed = decode_only && drafting;
  if (!t.timed) return t;
  std::lock_guard<std::mutex> l(metrics_mu_);
  t.tokens_before = metrics_.generation_tokens;
  return t;
}

void Engine::end_speculative_timing(const StepTiming& t) {
  if (!t.timed) return;
  uint64_t tokens = 0;
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    tokens = metrics_.generation_tokens - t.tokens_before;
  }
  batch_limit_.record(/*speculative=*/true, t.batch, double(tokens),
                      std::chrono::duration<double>(Clock::now() - t.start).count());
}

void Engine::time_plain_step(bool decode_only, int batch) {
  const auto now = Clock::now();
  if (plain_timed_ && decode_only && auto_batch_limit())
    batch_limit_.record(/*speculative=*/false, batch, double(batch),
                        std::chrono::duration<double>(now - last_plain_finish_).count());
  last_plain_finish_ = now;
  plain_timed_ = true;
}

void Engine::loop() {
  while (!stopping_) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "engine: step failed: %s\n", e.what());
    }
    // Blocks first: a reader that sees a request's end in num_requests_running also sees its blocks freed.
    stat_blocks_free_ = blocks_.num_free();
    stat_running_ = int(sched_.num_running());
    if (auto_batch_limit()) stat_auto_limit_ = batch_limit_.settled();
    if (prefix_cache_) stat_prefix_bytes_ = prefix_cache_->bytes();
    if (host_cache_) stat_prefix_host_bytes_ = host_cache_->bytes();
    {
      std::lock_guard<std::mutex> l(mu_);
      stat_waiting_ = int(sched_.num_waiting());
    }
    if (!worked) {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(50),
                   [&] { return stopping_.load() || !inbox_.empty() || !aborts_.empty(); });
    }
  }
  abort_all();
}

void Engine::run_until_done(const std::function<void()>& after_step) {
  try {
    while (step())
      if (after_step) after_step();
  } catch (...) {
    abort_all();
    throw;
  }
  abort_all();
  if (after_step) after_step();
}

void Engine::abort_all() {
  if (inflight_.active) finish_overlapped(inflight_);
  if (round_.active) finish_round(round_, /*next_chained=*/false);
  drain_inbox();
  std::vector<Request*> all;
  for (auto& [r, up] : live_) all.push_back(r);
  for (Request* r : all) finish(*r, "abort");
  stat_blocks_free_ = blocks_.num_free();
  stat_running_ = 0;
  stat_waiting_ = 0;
}

}  // namespace fathom
