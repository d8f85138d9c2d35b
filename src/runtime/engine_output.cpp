// The serving engine's output processing (Engine, engine.h): a forward's rows turned into each
// request's tokens (sampling, draft verification, logprobs), its text (detokenization, stop
// strings held back) and its end (stop, length, error), streamed as RequestOutput events.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "grammar/matcher.h"
#include "kernels/cpu/row_sampler.h"
#include "runtime/engine.h"
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

}  // namespace

void Engine::flush(Request& r, bool finished, const std::string& reason) {
  RequestOutput out = std::move(r.pending);
  r.pending = RequestOutput{};
  out.index = r.spec.index;
  out.finished = finished;
  out.finish_reason = finished ? reason : "";
  out.prompt_tokens = int(r.num_prompt);
  out.completion_tokens = int(r.num_output());
  out.cached_tokens = int(r.num_cached);
  if (finished) {
    out.decode_steps = r.decode_steps;
    out.spec = r.spec_stats;
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

Acceptance Engine::pick_from_row(Request& r, const float* logits, const int32_t* draft, TokenLogprob& lp) {
  const int64_t vocab = runner_->config().vocab_size;
  const Acceptance acc = choose(r, logits, vocab, draft);
  if (const int n = r.spec.params.logprobs; n >= 0) {
    TokenLogprobs t = compute_logprobs(logits, vocab, acc.token, n);
    lp = TokenLogprob{acc.token, t.logprob, std::move(t.top)};
  }
  return acc;
}

Acceptance Engine::pick(Request& r, const StepResult& res, int64_t row, const int32_t* draft, TokenLogprob& lp) {
  const RequestParams& p = r.spec.params;
  if (res.fo) return pick_from_row(r, res.fo->logits.data() + row * runner_->config().vocab_size, draft, lp);
  maybe_inject_fault(p.fault, FaultSite::Sample, r.num_output());
  const RowSample& s = res.so->samples[size_t(row)];
  if (p.logprobs >= 0) lp = device_logprob(s, res.so->top_ids, res.so->top_logprobs, row, p.logprobs);
  return Acceptance{draft != nullptr && s.accepted != 0, s.token};
}

Acceptance Engine::pick_like_device(Request& r, const float* logits, TokenLogprob& lp) {
  const RequestParams& p = r.spec.params;
  maybe_inject_fault(p.fault, FaultSite::Sample, r.num_output());
  const int64_t vocab = runner_->config().vocab_size;
  SamplingRows one(vocab);
  one.add(r, {}, -1, eos_, grammar_mask(r, vocab));
  std::vector<float> row(logits, logits + vocab);
  std::vector<LogitAdjustment> adjust = one.adjustments();
  RowSample s;
  std::vector<int32_t> top_ids(kMaxTopLogprobs, -1);
  std::vector<float> top_logprobs(kMaxTopLogprobs, 0.f);
  cpu::sample_rows(row.data(), 1, vocab, one.rows().data(), adjust.data(), &s, top_ids.data(), top_logprobs.data(),
                   one.masks().empty() ? nullptr : one.masks().data());
  if (p.logprobs >= 0) lp = device_logprob(s, top_ids, top_logprobs, 0, p.logprobs);
  return Acceptance{false, s.token};
}

TokenLogprob Engine::device_logprob(const RowSample& s, const std::vector<int32_t>& top_ids,
                                    const std::vector<float>& top_logprobs, int64_t row, int n) {
  TokenLogprob lp{s.token, s.logprob, {}};
  for (int j = 0; j < std::min(n, kMaxTopLogprobs); ++j)
    lp.top.emplace_back(top_ids[size_t(row * kMaxTopLogprobs + j)], top_logprobs[size_t(row * kMaxTopLogprobs + j)]);
  return lp;
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

// A decode round of r: its step count and, when drafting, the acceptance statistics (before the
// final event) and the draft length.
void Engine::record_round(Request& r, int drafted, int accepted) {
  ++r.decode_steps;
  if (!spec_) return;
  {
    std::lock_guard<std::mutex> l(metrics_mu_);
    metrics_.spec.record(drafted, accepted);
  }
  r.spec_stats.record(drafted, accepted);
  spec_->record(r.seq, drafted, accepted);
}

// Samples (and verifies drafts) from one sequence's rows of a forward, streams what it produced,
// and keeps the engine's count of consumed tokens equal to the runner's.
void Engine::finish_chunk(Request& r, const ForwardStep& step, const StepResult& res, size_t i, int64_t pos,
                          Clock::time_point now) {
  const bool need_hidden = spec_ && spec_->needs_hidden() && !r.spec_off;
  const int64_t H = runner_->config().hidden_size;
  const SequenceId seq = r.seq;
  const int64_t n = int64_t(step.tokens.size());
  const int nd = int(r.drafts.size());
  const int64_t first_row = res.row_begin()[i], rows = step.all_rows ? n : 1;
  const bool decode_round = r.num_output() > 0 && pos == int64_t(r.tokens.size()) - 1;  // before any emission
  r.num_computed += n;
  r.next_draft = -1;  // the MTP layer is behind again (the rows below queue for it)
  // The target's rows at positions pos + from.. feed the MTP, each with the token that follows it.
  int64_t observed = 0;
  auto observe = [&](int64_t count) {
    if (need_hidden && count > 0)
      spec_->observe(seq, pos + observed,
                     std::span<const float>(res.hidden().data() + (res.hidden_row_begin()[i] + observed) * H,
                                            size_t(count * H)),
                     std::span<const int32_t>(r.tokens.data() + pos + observed + 1, size_t(count)));
    observed += count;
  };
  if (r.num_computed < int64_t(r.tokens.size())) {  // a prefill chunk that is not the last
    observe(n);
    return;
  }
  const int64_t V = runner_->config().vocab_size, last_row = first_row + rows - 1;
  const float* end_logits = !prompt_end_snapshots_ || nd > 0 || r.num_output() > 0 ? nullptr
                            : res.fo                                             ? res.fo->logits.data() + last_row * V
                                                                                 : res.so->kept_row_logits(last_row, V);
  // The prompt's end, cached (a device row comes back only when wants_prompt_end() asked for it).
  if (end_logits && (res.so || !prefix_cache_->contains_prompt_end(r.prompt_span(), prompt_blocks_hash(r)))) {
    const float* hidden = nullptr;
    if (need_hidden) {  // the MTP layer catches up to the last row, which waits for the token after it
      observe(n - 1);
      spec_->catch_up(seq);
      hidden = res.hidden().data() + (res.hidden_row_begin()[i] + n - 1) * H;
    }
    snapshot_prompt_end(r, end_logits, hidden);
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
  if (decode_round) record_round(r, nd, accepted);
  if (!finish_reason.empty()) {
    finish(r, finish_reason);  // frees r
    return;
  }
  if (nd > 0) {
    r.num_computed = int64_t(r.tokens.size()) - 1;  // the pending token + the accepted drafts
    if (accepted < nd) runner_->rollback(seq, r.num_computed);
    blocks_.shrink(r.block_table, r.num_computed);
  }
  observe(r.num_computed - pos - observed);
  r.drafts.clear();
}

}  // namespace fathom
