// What an engine needs to choose the token of one logits row where the logits are (sampling on
// the GPU): plain structs, uploaded once per step, so that only the chosen ids (and the logprobs a
// request asks for) come back instead of [rows, vocab] fp32 logits.
//
// Semantics are the CPU sampler's (runtime/sampler.h, runtime/spec_sampling.h): adjustments
// (penalties, logit bias, min_tokens masking) first; temperature <= 0 picks the argmax (ties to
// the lowest id); otherwise softmax(logits / temperature) cut by top-k, min-p and top-p. A draft
// (deterministic: MTP argmax chain or n-gram) is accepted with probability p(draft), else the
// token is drawn from p without the draft. A draft drawn from a distribution q (a row with
// q_out, which writes the q it drew from) is accepted with probability min(1, p / q), else the
// token is drawn from max(p - q, 0): lossless for any q, and accepted with sum min(p, q), more
// than p(argmax q) when the draft model is not sure (docs/perf.md, issue 34, stop 61). Random
// numbers are a function of (seed, draw, j) only (j = 0, 1: the row's choice; j = 2: a draft
// drawn for that position), so a seeded request gets the same tokens whatever batch it runs in.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FATHOM_HOST_DEVICE __host__ __device__
#else
#define FATHOM_HOST_DEVICE
#endif

namespace fathom {

struct RowSampling {
  float temperature = 0.f;  // <= 0: greedy
  int32_t top_k = 0;        // <= 0: off
  float top_p = 1.f;
  float min_p = 0.f;
  uint64_t seed = 0;
  uint64_t draw = 0;        // the request's draw counter (its output position)
  int32_t draft = -1;       // >= 0: verify this deterministic draft (kDraftFromRound: a chained
                            // round's, which the runner fills in: ModelRunner::launch_verify_draft)
  int32_t logprobs = -1;    // -1: none; k >= 0: the chosen token's logprob and the top k (k <= kMaxTopLogprobs)
  int32_t adjust_begin = 0, adjust_end = 0;  // this row's entries of the adjustment list
  int32_t skip = 0;         // a row nobody reads (a prefill chunk that is not the last): no work
  int32_t state_slot = -1;  // >= 0: also store the chosen token as that sequence's last token on the
                            // device (the next step may read it before the host has it)
  int32_t mask_row = -1;    // >= 0: this row's entry of the step's token masks (structured output):
                            // only tokens whose bit is set may be chosen, after the adjustments
  int32_t keep_logits = 0;  // 1: also return the row's raw logits (a prompt's end, for the prefix cache)
  int32_t q_out = -1;       // >= 0: this row draws a draft (no `draft` of its own): its random number is
                            // j = 2 of (seed, draw), and the distribution it draws from (one-hot at the
                            // argmax when greedy) goes to row q_out of the step's draft distributions
  int32_t draft_q = -1;     // >= 0 with a draft: the draft was drawn from row draft_q of the step's
                            // draft distributions (float [vocab] each): min(1, p / q) and max(p - q, 0);
                            // kDraftQKept: the one the runner kept for this sequence's draft
  int32_t draw_draft = 0;   // 1, fused MTP rounds: this row's MTP draft is drawn (q_out) with this row's
                            // parameters at the next position (draw + 1), and the runner keeps its q
                            // for the round that verifies it (ModelRunner::draws_sampled_drafts)
};

// RowSampling::draft_q of a fused round's draft row: the distribution the runner kept when it drew
// that sequence's draft; the runner falls back to the deterministic rule (lossless for any draft)
// unless it kept one for this position and token.
inline constexpr int32_t kDraftQKept = -2;

// The MTP row of verify row `r` in a fused round: with r.draw_draft, r's parameters at the next
// position (nothing of r's own: adjustments, mask, logprobs, draft; any q keeps the round
// lossless), else a greedy row (the argmax draft). The caller sets q_out.
FATHOM_HOST_DEVICE inline RowSampling mtp_draft_row(const RowSampling& r) {
  RowSampling d;
  if (!r.draw_draft) return d;
  d.temperature = r.temperature, d.top_k = r.top_k, d.top_p = r.top_p, d.min_p = r.min_p;
  d.seed = r.seed;
  d.draw = r.draw + 1;
  return d;
}

// RowSampling::draft of a chained MTP round's first row: the draft the round before it made,
// known only where that round ran.
inline constexpr int32_t kDraftFromRound = -2;

// Words of one row's token mask: bit (t % 32) of word t / 32 is token t.
inline constexpr int64_t mask_words(int64_t vocab) { return (vocab + 31) / 32; }

inline constexpr int kMaxTopLogprobs = 20;

// One token's change of one row, in the CPU order: repetition penalty (l > 0 ? l / rep : l * rep),
// minus `sub` (frequency * count + presence), plus `bias`; `mask` makes it -inf (min_tokens).
// `raw` receives the logit before the change (logprobs are reported from raw logits).
struct LogitAdjustment {
  int32_t token = 0;
  float rep = 1.f;
  float sub = 0.f;
  float bias = 0.f;
  int32_t mask = 0;
  float raw = 0.f;
};

// Logit x of e.token after e: the one definition of the device sampler and the CPU row sampler.
FATHOM_HOST_DEVICE inline float adjusted_logit(const LogitAdjustment& e, float x) {
  if (e.rep != 1.f) x = x > 0 ? x / e.rep : x * e.rep;
  x -= e.sub;
  x += e.bias;
  return e.mask ? -INFINITY : x;
}

struct RowSample {
  int32_t token = -1;
  int32_t accepted = 0;   // with a draft: whether it was accepted (then token == draft)
  float logprob = 0.f;    // log_softmax(raw logits)[token], when logprobs >= 0
  float lse = 0.f;        // logsumexp of the raw row, when logprobs >= 0
};

}  // namespace fathom
