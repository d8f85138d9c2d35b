#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace fathom {
namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Largest cut <= pos that does not split a UTF-8 sequence.
size_t utf8_floor(const std::string& s, size_t pos) {
  if (pos >= s.size()) return s.size();
  while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

std::string fmt_double(double v) {
  if (std::isinf(v)) return "+Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help, const std::string& labels) const {
  std::ostringstream os;
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    os << name << "_bucket{" << labels << ",le=\""
       << (i < bounds_.size() ? fmt_double(bounds_[i]) : std::string("+Inf")) << "\"} " << cum << "\n";
  }
  os << name << "_sum{" << labels << "} " << fmt_double(sum_) << "\n";
  os << name << "_count{" << labels << "} " << count_ << "\n";
  return os.str();
}

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
    : runner_(std::move(runner)),
      tok_(tokenizer),
      cfg_(cfg),
      blocks_(num_blocks(cfg, *runner_), cfg.block_size),
      slots_(cfg.max_num_seqs),
      sched_(SchedulerConfig{cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_prefill_tokens}, blocks_, slots_),
      eos_(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end()),
      device_sampling_(cfg.device_sampling && runner_->samples_on_device()),
      sampling_rows_(runner_->config().vocab_size) {
  overlap_ = device_sampling_ && cfg.overlap_schedule && runner_->supports_pending_tokens() &&
             cfg.spec.algorithm == SpecAlgorithm::None;
  FATHOM_CHECK(cfg.max_num_batched_tokens > 0, "--max-num-batched-tokens must be positive");
  if (cfg.spec.algorithm != SpecAlgorithm::None)
    spec_ = std::make_unique<Speculator>(*runner_, cfg.spec, cfg.max_num_batched_tokens);
  if (cfg.enable_prefix_caching && runner_->supports_snapshots()) {
    FATHOM_CHECK(cfg.prefix_cache_interval >= 0, "--prefix-cache-interval must not be negative");
    prefix_cache_ = std::make_unique<PrefixCache>(cfg.block_size, cfg.prefix_cache_bytes);
    sched_.set_admit_hook([this](Request& r) { return admit(r); });
    sched_.set_align_chunks(true);
  }
  stat_blocks_free_ = blocks_.num_free();
  for (const char* r : {"stop", "length", "abort", "error"}) metrics_.finished[r] = 0;
  for (const char* st : {"sample", "detokenize", "stop", "forward", "postprocess"}) metrics_.errors[st] = 0;
}

Engine::~Engine() { shutdown(); }

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

Engine::Stats Engine::stats() const {
  Stats s;
  s.running = stat_running_;
  s.waiting = stat_waiting_;
  s.kv_blocks_total = blocks_.num_blocks();
  s.kv_blocks_free = stat_blocks_free_;
  s.kv_usage = s.kv_blocks_total ? double(s.kv_blocks_total - s.kv_blocks_free) / double(s.kv_blocks_total) : 0.0;
  return s;
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

void Engine::flush(Request& r, bool finished, const std::string& reason) {
  RequestOutput out = std::move(r.pending);
  r.pending = RequestOutput{};
  out.index = r.spec.index;
  out.finished = finished;
  out.finish_reason = finished ? reason : "";
  out.prompt_tokens = int(r.num_prompt);
  out.completion_tokens = int(r.num_output());
  if (finished) {
    std::lock_guard<std::mutex> l(metrics_mu_);
    ++metrics_.finished[reason];
    metrics_.e2e.observe(seconds(Clock::now() - r.arrival));
  }
  if (r.spec.out) r.spec.out->push(std::move(out));
}

void Engine::finish(Request& r, const std::string& reason) {
  flush(r, true, reason);
  drop(&r);
}

std::string Engine::process_token(Request& r, int64_t out_pos, int32_t token, TokenLogprob* logprob,
                                  Clock::time_point now) {
  const RequestParams& p = r.spec.params;
  if (logprob) r.pending.logprobs.push_back(std::move(*logprob));
  // The token's place: the end, or a placeholder an overlapped step already fed back.
  if (out_pos < int64_t(r.tokens.size())) r.tokens[size_t(out_pos)] = token;
  else r.tokens.push_back(token);
  if (r.matcher && !r.matcher->accept_token(token))
    throw RequestError("sample", "structured output: token " + std::to_string(token) + " is outside the grammar");
  const int64_t produced = out_pos + 1 - r.num_prompt;  // output tokens up to this one
  r.pending.token_ids.push_back(token);
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    ++metrics_.generation_tokens;
    if (!r.has_first_token) {
      metrics_.ttft.observe(seconds(now - r.arrival));
      metrics_.prompt_tokens += uint64_t(r.num_prompt);
    } else {
      metrics_.itl.observe(seconds(now - r.last_token));
    }
  }
  if (!r.has_first_token) r.first_token = now;
  r.has_first_token = true;
  r.last_token = now;

  const size_t prev_size = r.text.size();
  if (r.detok) {
    maybe_inject_fault(p.fault, FaultSite::Detokenize, produced);
    if (auto piece = r.detok->step(uint32_t(token))) r.text += *piece;
  }
  maybe_inject_fault(p.fault, FaultSite::Stop, produced);

  std::string reason;
  // Under a grammar the matcher decides: a stop token ends the output only where it is complete
  // (an eos id that is ordinary text in the tokenizer is text there).
  const bool is_eos = r.matcher ? r.matcher->is_terminated() : !p.ignore_eos && eos_.count(token);
  const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  size_t max_stop = 0;
  for (const auto& s : p.stop) max_stop = std::max(max_stop, s.size());
  if ((is_eos || is_stop_id) && produced >= p.min_tokens) {
    reason = "stop";
    if (is_stop_id && !is_eos) r.pending.stop_token = token;
  } else if (max_stop > 0 && r.text.size() > prev_size) {
    const size_t from = prev_size >= max_stop - 1 ? prev_size - (max_stop - 1) : 0;
    size_t best = std::string::npos;
    const std::string* hit = nullptr;
    for (const auto& s : p.stop) {
      if (s.empty()) continue;
      size_t pos = r.text.find(s, from);
      if (pos != std::string::npos && pos < best) best = pos, hit = &s;
    }
    if (hit) {
      r.text.resize(best + (p.include_stop_str_in_output ? hit->size() : 0));
      r.pending.stop_str = *hit;
      reason = "stop";
    }
  }
  if (reason.empty() &&
      (produced >= p.max_tokens || out_pos + 1 >= cfg_.max_model_len))
    reason = "length";
  if (!reason.empty()) r.tokens.resize(size_t(out_pos + 1));  // placeholders past the end go

  // At the end, text still pending in the detokenizer (an incomplete UTF-8 tail) is released as
  // a full decode gives it (U+FFFD), so the final text equals decode(output ids).
  if (!reason.empty() && r.pending.stop_str.empty() && r.detok && tok_) {
    std::vector<uint32_t> ids(r.output_span().begin(), r.output_span().end());
    std::string full = tok_->decode(ids, p.skip_special_tokens);
    if (full.size() > r.text.size() && full.compare(0, r.text.size(), r.text) == 0) r.text = std::move(full);
  }
  // Release text, holding back what could still become the start of a stop string.
  size_t cut = r.text.size();
  if (reason.empty() && max_stop > 1) cut = utf8_floor(r.text, r.text.size() >= max_stop - 1 ? r.text.size() - (max_stop - 1) : 0);
  if (cut > r.text_released) {
    r.pending.text = r.text.substr(r.text_released, cut - r.text_released);
    r.text_released = cut;
  }
  if (!reason.empty()) {
    if (reason == "stop" && r.text_released > r.text.size()) r.text_released = r.text.size();
    return reason;
  }
  flush(r, false, "");
  return "";
}

const uint32_t* Engine::grammar_mask(const Request& r, int64_t vocab) {
  if (!r.matcher) return nullptr;
  grammar_words_.assign(std::max<size_t>(size_t(mask_words(vocab)), r.matcher->vocab().mask_words()), 0u);
  r.matcher->fill_next_token_bitmask(grammar_words_);
  return grammar_words_.data();
}

Acceptance Engine::choose(Request& r, const float* row, int64_t vocab, const int32_t* draft) {
  const RequestParams& p = r.spec.params;
  const bool mask = r.num_output() < p.min_tokens && (!eos_.empty() || !p.stop_token_ids.empty());
  maybe_inject_fault(p.fault, FaultSite::Sample, r.num_output());
  const float* logits = row;
  std::vector<float>& scratch = logits_scratch_;
  if (mask || r.matcher || (draft && r.sampler.adjusts_logits())) {
    scratch.assign(row, row + vocab);
    const float ninf = -std::numeric_limits<float>::infinity();
    if (const uint32_t* allowed = grammar_mask(r, vocab)) {  // a draft the grammar refuses is rejected
      for (int64_t t = 0; t < vocab; ++t)
        if (!(allowed[t >> 5] >> (t & 31) & 1u)) scratch[size_t(t)] = ninf;
    }
    if (mask && !p.ignore_eos)
      for (int32_t e : eos_)
        if (e >= 0 && e < vocab) scratch[e] = ninf;
    if (mask)
      for (int32_t e : p.stop_token_ids)
        if (e >= 0 && e < vocab) scratch[e] = ninf;
    logits = scratch.data();
  }
  if (!draft) return Acceptance{false, r.sampler.sample(logits, vocab, r.prompt_span(), r.output_span())};
  if (r.sampler.adjusts_logits())
    apply_logit_adjustments(scratch.data(), vocab, p.sampling, r.prompt_span(), r.output_span());
  return verify_draft(logits, vocab, p.sampling, *draft, r.sampler.rng());
}

Acceptance Engine::pick(Request& r, const StepResult& res, int64_t row, const int32_t* draft, TokenLogprob& lp) {
  const RequestParams& p = r.spec.params;
  if (res.fo) {
    const int64_t vocab = runner_->config().vocab_size;
    const float* logits = res.fo->logits.data() + row * vocab;
    const Acceptance acc = choose(r, logits, vocab, draft);
    if (p.logprobs >= 0) {
      TokenLogprobs t = compute_logprobs(logits, vocab, acc.token, p.logprobs);
      lp = TokenLogprob{acc.token, t.logprob, std::move(t.top)};
    }
    return acc;
  }
  maybe_inject_fault(p.fault, FaultSite::Sample, r.num_output());
  const RowSample& s = res.so->samples[size_t(row)];
  if (p.logprobs >= 0) {
    lp = TokenLogprob{s.token, s.logprob, {}};
    for (int j = 0; j < std::min(p.logprobs, kMaxTopLogprobs); ++j)
      lp.top.emplace_back(res.so->top_ids[size_t(row * kMaxTopLogprobs + j)],
                          res.so->top_logprobs[size_t(row * kMaxTopLogprobs + j)]);
  }
  return Acceptance{draft != nullptr && s.accepted != 0, s.token};
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
    } else {
      sampling_rows_.add_skip();  // a prefill chunk before the prompt's end
    }
  }
}

// Drafts for every running sequence that is decoding (all its tokens but the last consumed),
// capped so the round can neither overshoot max_tokens nor the context.
void Engine::propose_drafts() {
  std::vector<DraftRequest> reqs;
  std::vector<Request*> who;
  for (auto& [r, up] : live_) {
    r->drafts.clear();
    if (r->status != RequestStatus::Running || !r->seq || r->num_output() == 0 ||
        r->num_computed != int64_t(r->tokens.size()) - 1)
      continue;
    const int64_t room = std::min<int64_t>(r->spec.params.max_tokens - r->num_output() - 1,
                                           cfg_.max_model_len - int64_t(r->tokens.size()));
    const int k = int(std::clamp<int64_t>(room, 0, spec_->max_drafts()));
    reqs.push_back(DraftRequest{r->seq, r->tokens, k, {}});
    who.push_back(r);
  }
  if (reqs.empty()) return;
  const int limit = spec_->options().disable_by_batch_size;
  if (limit > 0 && int(reqs.size()) >= limit) return;
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

void Engine::observe_queue(Request& r) {
  if (r.queue_observed) return;
  r.queue_observed = true;
  std::lock_guard<std::mutex> l(metrics_mu_);
  metrics_.queue.observe(seconds(Clock::now() - r.arrival));
}

bool Engine::step() {
  drain_inbox();
  if (overlap_) return step_overlapped();
  if (!sched_.has_work()) return false;
  if (spec_) propose_drafts();
  take_snapshots();
  SchedulerOutput plan = sched_.schedule();
  for (Request* p : plan.preempted) {
    if (p->seq && spec_) spec_->release(p->seq);
    if (p->seq) runner_->remove_sequence(p->seq);
    p->seq = 0;
  }
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.preemptions += plan.preempted.size();
  }
  if (plan.chunks.empty()) return false;

  const bool need_hidden = spec_ && spec_->needs_hidden();
  std::vector<ForwardStep> steps;
  std::vector<int64_t> len_before;
  steps.reserve(plan.chunks.size());
  for (const ScheduledChunk& c : plan.chunks) {
    Request* r = c.req;
    start_sequence(*r);
    len_before.push_back(r->num_computed);
    // A budget-cut chunk verifies fewer drafts.
    const int64_t pending = int64_t(r->tokens.size()) - r->num_computed;
    r->drafts.resize(size_t(std::clamp<int64_t>(c.num_tokens - pending, 0, int64_t(r->drafts.size()))));
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
  return true;
}

void Engine::fail_request(Request& r, const std::string& stage, const std::string& what) {
  std::fprintf(stderr, "engine: request %llu/%d failed (%s): %s\n", (unsigned long long)r.spec.group, r.spec.index,
               stage.c_str(), what.c_str());
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    ++metrics_.errors[stage];
  }
  r.pending.error = what;
  finish(r, "error");
}

// Samples (and verifies drafts) from one sequence's rows of a forward, streams what it produced,
// and keeps the engine's count of consumed tokens equal to the runner's.
void Engine::finish_chunk(Request& r, const ForwardStep& step, const StepResult& res, size_t i, int64_t pos,
                          Clock::time_point now) {
  const bool need_hidden = spec_ && spec_->needs_hidden();
  const int64_t H = runner_->config().hidden_size;
  const SequenceId seq = r.seq;
  const int64_t n = int64_t(step.tokens.size());
  const int nd = int(r.drafts.size());
  const int64_t first_row = res.row_begin()[i], rows = step.all_rows ? n : 1;
  const bool decode_round = r.num_output() > 0 && pos == int64_t(r.tokens.size()) - 1;  // before any emission
  r.num_computed += n;
  // The target's rows at positions pos.. feed the MTP, each with the token that follows it.
  auto observe = [&](int64_t count) {
    if (need_hidden)
      spec_->observe(seq, pos,
                     std::span<const float>(res.hidden().data() + res.hidden_row_begin()[i] * H, size_t(count * H)),
                     std::span<const int32_t>(r.tokens.data() + pos + 1, size_t(count)));
  };
  if (r.num_computed < int64_t(r.tokens.size())) {  // a prefill chunk that is not the last
    observe(n);
    return;
  }
  // Row `rows - 1 - nd` is the pending token's; each draft row after it verifies one draft.
  int accepted = 0;
  std::string finish_reason;
  for (int d = 0; d <= nd && finish_reason.empty(); ++d) {
    TokenLogprob lp;
    const Acceptance acc = pick(r, res, first_row + rows - 1 - nd + d, d < nd ? &r.drafts[size_t(d)] : nullptr, lp);
    if (d < nd && acc.accepted) ++accepted;
    finish_reason =
        process_token(r, int64_t(r.tokens.size()), acc.token, r.spec.params.logprobs >= 0 ? &lp : nullptr, now);
    if (d < nd && !acc.accepted) break;
  }
  if (spec_ && decode_round) {  // acceptance statistics (before the final event) and draft length
    {
      std::lock_guard<std::mutex> l(metrics_mu_);
      metrics_.spec.record(nd, accepted);
    }
    spec_->record(seq, nd, accepted);
  }
  if (!finish_reason.empty()) {
    finish(r, finish_reason);  // frees r
    return;
  }
  if (nd > 0) {
    r.num_computed = int64_t(r.tokens.size()) - 1;  // the pending token + the accepted drafts
    if (accepted < nd) runner_->rollback(seq, r.num_computed);
    blocks_.shrink(r.block_table, r.num_computed);
  }
  observe(r.num_computed - pos);
  r.drafts.clear();
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
  if (inflight_.active) finish_overlapped(inflight_);
  drain_inbox();
  std::vector<Request*> all;
  for (auto& [r, up] : live_) all.push_back(r);
  for (Request* r : all) finish(*r, "abort");
  stat_blocks_free_ = blocks_.num_free();
  stat_running_ = 0;
  stat_waiting_ = 0;
}

std::string Engine::render_metrics(const std::string& prefix, const std::string& model_name) const {
  const std::string labels = "model_name=\"" + model_name + "\"";
  std::ostringstream os;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " gauge\n"
       << prefix << name << "{" << labels << "} " << fmt_double(v) << "\n";
  };
  auto counter = [&](const std::string& name, const std::string& help, uint64_t v) {
    os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " counter\n"
       << prefix << name << "{" << labels << "} " << v << "\n";
  };
  const Stats s = stats();
  gauge("num_requests_running", "Number of sequences in model execution batches.", s.running);
  gauge("num_requests_waiting", "Number of sequences waiting to be processed.", s.waiting);
  gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage);
  gauge("kv_cache_blocks_total", "KV-cache blocks (16 tokens each).", double(s.kv_blocks_total));
  std::lock_guard<std::mutex> l(metrics_mu_);
  counter("num_preemptions_total", "Cumulative number of preemptions (recompute).", metrics_.preemptions);
  counter("prompt_tokens_total", "Number of prefill tokens processed.", metrics_.prompt_tokens);
  counter("generation_tokens_total", "Number of generation tokens processed.", metrics_.generation_tokens);
  counter("requests_received_total", "Number of client requests accepted.", metrics_.requests_received);
  if (prefix_cache_) {  // vLLM's names: tokens looked up, tokens found
    counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", metrics_.prefix_queries);
    counter("prefix_cache_hits_total", "Prompt tokens served from the prefix cache.", metrics_.prefix_hits);
    gauge("prefix_cache_hit_rate", "Prefix cache hits / queries (tokens).",
          metrics_.prefix_queries ? double(metrics_.prefix_hits) / double(metrics_.prefix_queries) : 0.0);
  }
  os << "# HELP " << prefix << "request_errors_total Sequences ended by an error, by where it was raised.\n"
     << "# TYPE " << prefix << "request_errors_total counter\n";
  for (const auto& [stage, n] : metrics_.errors)
    os << prefix << "request_errors_total{" << labels << ",stage=\"" << stage << "\"} " << n << "\n";
  os << "# HELP " << prefix << "request_success_total Count of finished sequences by finish reason.\n"
     << "# TYPE " << prefix << "request_success_total counter\n";
  for (const auto& [reason, n] : metrics_.finished)
    os << prefix << "request_success_total{" << labels << ",finished_reason=\"" << reason << "\"} " << n << "\n";
  os << metrics_.ttft.render(prefix + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels);
  os << metrics_.itl.render(prefix + "inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels);
  os << metrics_.e2e.render(prefix + "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", labels);
  os << metrics_.queue.render(prefix + "request_queue_time_seconds", "Histogram of time spent waiting before the first forward.", labels);
  if (spec_) {  // vLLM's spec_decode_* names, plus the derived rates
    const SpecStats& sp = metrics_.spec;
    counter("spec_decode_num_drafts_total", "Verification rounds that had at least one draft.", uint64_t(sp.draft_rounds));
    counter("spec_decode_num_draft_tokens_total", "Draft tokens verified.", uint64_t(sp.draft_tokens));
    counter("spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", uint64_t(sp.accepted_tokens));
    auto per_pos = [&](const std::string& name, const std::string& type, const std::string& help, auto value) {
      os << "# HELP " << prefix << name << " " << help << "\n# TYPE " << prefix << name << " " << type << "\n";
      for (size_t i = 0; i < sp.drafted_at.size(); ++i)
        os << prefix << name << "{" << labels << ",position=\"" << i << "\"} " << value(i) << "\n";
    };
    per_pos("spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted draft tokens by draft position.",
            [&](size_t i) { return std::to_string(sp.accepted_at[i]); });
    per_pos("spec_decode_num_draft_tokens_per_pos_total", "counter", "Verified draft tokens by draft position.",
            [&](size_t i) { return std::to_string(sp.drafted_at[i]); });
    const std::vector<double> rate = sp.acceptance_by_position();
    per_pos("spec_decode_acceptance_rate_per_pos", "gauge", "Accepted / verified drafts by draft position.",
            [&](size_t i) { return fmt_double(rate[i]); });
    gauge("spec_decode_draft_acceptance_rate", "Accepted / verified draft tokens.", sp.acceptance_rate());
    gauge("spec_decode_mean_accepted_length",
          "Tokens emitted per verification round with drafts (accepted drafts + 1).", sp.mean_accepted_length());
  }
  return os.str();
}

}  // namespace fathom
