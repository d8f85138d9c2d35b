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

  // Decode rounds.
  for (;;) {
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
      reqs.push_back(DraftRequest{s.id, s.ctx, std::max(k, 0), {}});
    }
    if (spec) spec->propose(reqs);
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
