#include "runtime/spec_decode.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>

#include "core/error.h"
#include "runtime/spec_sampling.h"

namespace fathom {

namespace {

struct Seq {
  SequenceId id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> ctx;  // prompt + generated; the last generated token is not yet in the target
  GenerateResult res;
  std::mt19937_64 rng;
  bool done = false;
  std::vector<int32_t> step_tokens;  // storage the spans of a round point into
  int32_t next_draft = -1;           // fused MTP rounds: the draft the last round's MTP rows made
};

// Owns the runner's sequences for the duration of a call.
struct SeqGuard {
  ModelRunner& runner;
  Speculator* spec;
  std::vector<Seq>& seqs;
  ~SeqGuard() {
    for (Seq& s : seqs) {
      if (!s.id) continue;
      if (spec) spec->release(s.id);
      runner.remove_sequence(s.id);
    }
  }
};

// One greedy MTP round of every unfinished sequence through forward_verify_draft: its last
// token and its draft (when max_new_tokens leaves room) verified, the MTP layer's row after the
// last accepted token giving the next round's draft. False when every sequence is done.
// Tests: `trace` gets every draft with the MTP position that made it (as the speculator's).
template <class Emit>
bool fused_round(ModelRunner& runner, std::vector<Seq>& seqs, const GenerateOptions& opt,
                 std::vector<MtpDrafter::Trace>* trace, Emit&& emit) {
  const ModelConfig& cfg = runner.config();
  std::vector<ForwardStep> steps;
  std::vector<Seq*> active;
  std::vector<int64_t> len_before;
  for (Seq& s : seqs) {
    if (s.done) continue;
    int64_t room = opt.max_new_tokens - int64_t(s.res.token_ids.size()) - 1;
    if (cfg.max_position_embeddings > 0) room = std::min<int64_t>(room, cfg.max_position_embeddings - runner.length(s.id) - 1);
    s.step_tokens.assign(1, s.ctx.back());
    if (room > 0 && s.next_draft >= 0) s.step_tokens.push_back(s.next_draft);
    active.push_back(&s);
    len_before.push_back(runner.length(s.id));
    steps.push_back(ForwardStep{s.id, s.step_tokens, /*all_rows=*/true, /*keep_history=*/true});
  }
  if (steps.empty()) return false;
  const VerifyDraftOutput out = runner.forward_verify_draft(steps);
  for (size_t j = 0; j < active.size(); ++j) {
    Seq& s = *active[j];
    const int64_t row = out.row_begin[j];
    const int nd = int(s.step_tokens.size()) - 1;
    int accepted = 0;
    while (accepted < nd && s.step_tokens[size_t(accepted) + 1] == out.target[size_t(row + accepted)]) ++accepted;
    for (int r = 0; r <= accepted; ++r)  // the accepted drafts, then the correction or bonus token
      if (emit(s, out.target[size_t(row + r)])) break;
    ++s.res.target_forward_steps;
    s.res.spec.record(nd, accepted);
    const int64_t keep = len_before[j] + 1 + accepted;
    runner.rollback(s.id, keep);
    runner.mtp_rollback(s.id, keep);
    s.next_draft = out.draft[size_t(row + accepted)];
    if (trace) trace->push_back({s.id, keep - 1, s.next_draft});
  }
  return true;
}

}  // namespace

std::vector<GenerateResult> generate_batch(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt, const SpecOptions& spec_opt) {
  const ModelConfig& cfg = runner.config();
  const int64_t V = cfg.vocab_size, H = cfg.hidden_size;
  FATHOM_CHECK(opt.max_new_tokens >= 0, "max_new_tokens must be >= 0");
  FATHOM_CHECK(opt.prefill_chunk > 0, "prefill chunk size must be positive");
  for (const auto& p : prompts) {
    FATHOM_CHECK(!p.empty(), "the prompt is empty");
    FATHOM_CHECK(cfg.max_position_embeddings <= 0 ||
                     int64_t(p.size()) + opt.max_new_tokens <= cfg.max_position_embeddings,
                 "prompt (", p.size(), " tokens) plus max_new_tokens (", opt.max_new_tokens,
                 ") exceeds the model's context length of ", cfg.max_position_embeddings);
  }
  std::unique_ptr<Speculator> spec;
  if (spec_opt.algorithm != SpecAlgorithm::None)
    spec = std::make_unique<Speculator>(runner, spec_opt, int64_t(opt.prefill_chunk));
  const bool need_hidden = spec && spec->needs_hidden();
  const bool greedy = opt.sampling.temperature <= 0.f;

  std::vector<Seq> seqs(prompts.size());
  SeqGuard guard{runner, spec.get(), seqs};
  for (size_t i = 0; i < prompts.size(); ++i) {
    Seq& s = seqs[i];
    s.prompt = prompts[i];
    s.ctx = prompts[i];
    s.res.prompt_tokens = int(prompts[i].size());
    s.res.finish_reason = "length";
    s.res.speculative = spec != nullptr;
    s.rng.seed(opt.sampling.seed + i);
    s.done = opt.max_new_tokens == 0;
  }
  if (opt.max_new_tokens == 0) {
    std::vector<GenerateResult> out;
    for (Seq& s : seqs) out.push_back(s.res);
    return out;
  }
  for (Seq& s : seqs) s.id = runner.add_sequence();

  auto pick = [&](Seq& s, const float* logits) -> int32_t {
    if (greedy) return argmax(logits, V);
    std::vector<double> p = target_distribution(logits, V, opt.sampling);
    return sample_from_weights(p, s.rng);
  };
  // Appends a generated token; returns true when the sequence is finished.
  auto emit = [&](Seq& s, int32_t tok) {
    s.res.token_ids.push_back(tok);
    s.ctx.push_back(tok);
    if (std::find(opt.stop_token_ids.begin(), opt.stop_token_ids.end(), tok) != opt.stop_token_ids.end()) {
      s.res.finish_reason = "stop";
      s.done = true;
    } else if (int(s.res.token_ids.size()) >= opt.max_new_tokens) {
      s.done = true;
    }
    return s.done;
  };
  // The target consumed ctx[pos, pos + rows) and returned their hidden rows: each is followed by
  // the next token of ctx (the last one just emitted, or the prompt's next chunk).
  auto observe = [&](Seq& s, int64_t pos, const ForwardOutput& out, size_t step, int64_t rows) {
    if (!need_hidden || s.done) return;
    const int64_t have = int64_t(s.ctx.size()) - pos - 1;
    const int64_t n = std::min(rows, have);
    spec->observe(s.id, pos,
                  std::span<const float>(out.hidden.data() + out.hidden_row_begin[step] * H, size_t(n * H)),
                  std::span<const int32_t>(s.ctx.data() + pos + 1, size_t(n)));
  };

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();

  // Ragged chunked prefill: every prompt's next chunk in the same forward.
  for (size_t begin = 0;; begin += size_t(opt.prefill_chunk)) {
    std::vector<ForwardStep> steps;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (begin >= seqs[i].prompt.size()) continue;
      const size_t end = std::min(seqs[i].prompt.size(), begin + size_t(opt.prefill_chunk));
      steps.push_back(ForwardStep{seqs[i].id, std::span<const int32_t>(seqs[i].prompt.data() + begin, end - begin),
                                  /*all_rows=*/false, /*keep_history=*/false, /*all_hidden=*/need_hidden});
      who.push_back(i);
    }
    if (steps.empty()) break;
    ForwardOutput out = runner.forward(steps);
    for (size_t j = 0; j < who.size(); ++j) {
      Seq& s = seqs[who[j]];
      const size_t n = steps[j].tokens.size(), end = begin + n;
      if (end == s.prompt.size()) emit(s, pick(s, out.logits.data() + out.row_begin[j] * V));
      observe(s, int64_t(begin), out, j, int64_t(n));
    }
    if (spec) spec->flush_long_backlogs();
  }
  const auto t1 = clock::now();

  // Greedy MTP rounds of one draft run as one launch where the runner can (the draft for the
  // next round comes back with the verification): the speculator drafts only the first round.
  const bool fused = spec && greedy && spec_opt.algorithm == SpecAlgorithm::Mtp && spec_opt.num_steps == 1 &&
                     !spec_opt.adaptive && runner.supports_fused_mtp_round();
  bool first_round = true;

  // Decode rounds.
  for (;;) {
    if (fused && !first_round) {
      if (!fused_round(runner, seqs, opt, spec_opt.mtp_trace, emit)) break;
      continue;
    }
    first_round = false;
    std::vector<size_t> active;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (!seqs[i].done) active.push_back(i);
    if (active.empty()) break;
    std::vector<DraftRequest> reqs;
    for (size_t i : active) {
      Seq& s = seqs[i];
      int k = std::min<int>(spec ? spec->max_drafts() : 0, opt.max_new_tokens - int(s.res.token_ids.size()) - 1);
      if (cfg.max_position_embeddings > 0)
        k = int(std::min<int64_t>(k, cfg.max_position_embeddings - runner.length(s.id) - 1));
      // Fused rounds: always one draft, so that the MTP layer catches up (fused_round drops a
      // draft there is no room for).
      reqs.push_back(DraftRequest{s.id, s.ctx, fused ? 1 : std::max(k, 0), {}});
    }
    if (spec) spec->propose(reqs);
    if (fused) {  // the first round's drafts come from the speculator, its verification fused
      for (size_t j = 0; j < active.size(); ++j)
        seqs[active[j]].next_draft = reqs[j].drafts.empty() ? -1 : reqs[j].drafts[0];
      if (!fused_round(runner, seqs, opt, spec_opt.mtp_trace, emit)) break;
      continue;
    }
    std::vector<ForwardStep> steps;
    std::vector<int64_t> len_before;
    for (size_t j = 0; j < active.size(); ++j) {
      Seq& s = seqs[active[j]];
      s.step_tokens.assign(1, s.ctx.back());
      s.step_tokens.insert(s.step_tokens.end(), reqs[j].drafts.begin(), reqs[j].drafts.end());
      len_before.push_back(runner.length(s.id));
      steps.push_back(ForwardStep{s.id, s.step_tokens, /*all_rows=*/true, /*keep_history=*/!reqs[j].drafts.empty()});
    }
    ForwardOutput out = runner.forward(steps);
    for (size_t j = 0; j < active.size(); ++j) {
      Seq& s = seqs[active[j]];
      const std::vector<int32_t>& drafts = reqs[j].drafts;
      const int nd = int(drafts.size());
      int accepted = 0;
      for (int r = 0; r <= nd; ++r) {
        const float* logits = out.logits.data() + (out.row_begin[j] + r) * V;
        if (r == nd) {  // every draft accepted: the bonus token
          emit(s, pick(s, logits));
          break;
        }
        const Acceptance acc = verify_draft(logits, V, opt.sampling, drafts[size_t(r)], s.rng);
        if (acc.accepted) ++accepted;
        if (emit(s, acc.token) || !acc.accepted) break;
      }
      ++s.res.target_forward_steps;
      s.res.spec.record(nd, accepted);
      if (!spec) continue;
      spec->record(s.id, nd, accepted);
      const int64_t keep = len_before[j] + 1 + accepted;
      if (runner.length(s.id) > keep) runner.rollback(s.id, keep);
      observe(s, len_before[j], out, j, int64_t(accepted) + 1);
    }
    if (spec) spec->flush_long_backlogs();
  }
  const auto t2 = clock::now();

  std::vector<GenerateResult> results;
  for (Seq& s : seqs) {
    s.res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    s.res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
    results.push_back(s.res);
  }
  return results;
}

GenerateResult generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const SpecOptions& spec) {
  return generate_batch(runner, {prompt}, opt, spec).front();
}

}  // namespace fathom
