#include "kernels/cpu/row_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace fathom::cpu {
namespace {

// Probabilities relative to the row's largest one as fixed-point integers (as the device's):
// sums are exact and independent of the order of addition.
constexpr float kFixedOne = 1099511627776.f;  // 2^40

// Order-preserving map of floats to unsigned keys (larger float, larger key).
uint32_t order_key(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Largest value, ties to the lowest index.
int64_t argmax_row(const float* l, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

// Logsumexp of the raw row and its `k` largest entries (ties to the lower id).
float logprobs(const float* l, int64_t V, int k, int32_t* top_ids, float* top_lp) {
  const float m = l[argmax_row(l, V)];
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(l[i]) - double(m));
  const float lse = m + float(std::log(s));
  k = top_ids && top_lp ? int(std::min<int64_t>(std::min(k, kMaxTopLogprobs), V)) : 0;
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  for (int r = 0; r < k; ++r) top_ids[r] = ids[size_t(r)], top_lp[r] = l[ids[size_t(r)]] - lse;
  return lse;
}

struct Weights {
  float m, inv_t;
  uint64_t operator()(float x) const { return static_cast<uint64_t>(std::exp((x - m) * inv_t) * kFixedOne); }
};

// The largest key t whose tokens at or above it weigh at least `target` (a count of one a token
// when !by_mass), or `lo` when the tokens from lo up weigh less: the device's select_key.
uint32_t select_key(const float* l, int64_t V, uint32_t lo, uint64_t target, Weights w, bool by_mass) {
  std::vector<std::pair<uint32_t, uint64_t>> kept;  // (key, weight) of the tokens from lo up
  for (int64_t i = 0; i < V; ++i)
    if (const uint32_t k = order_key(l[i]); k >= lo) kept.emplace_back(k, by_mass ? w(l[i]) : 1);
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  uint64_t mass = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    mass += kept[i].second;
    const bool last_of_key = i + 1 == kept.size() || kept[i + 1].first != kept[i].first;
    if (last_of_key && mass >= target) return kept[i].first;
  }
  return lo;
}

RowSample sample_row(float* l, int64_t V, const RowSampling& P, LogitAdjustment* adjust, int32_t* top_ids,
                     float* top_lp, const uint32_t* masks, float* q_rows) {
  RowSample res{};
  // 1. Logprobs come from the raw logits.
  if (P.logprobs >= 0) res.lse = logprobs(l, V, P.logprobs, top_ids, top_lp);
  // 2. Penalties, logit bias and min_tokens masking (one entry per token of the row).
  for (int32_t a = P.adjust_begin; a < P.adjust_end; ++a) {
    LogitAdjustment& e = adjust[a];
    const float x = l[e.token];
    e.raw = x;
    l[e.token] = adjusted_logit(e, x);
  }
  if (P.mask_row >= 0 && masks) {  // structured output
    const uint32_t* mw = masks + int64_t(P.mask_row) * mask_words(V);
    for (int64_t i = 0; i < V; ++i)
      if (!((mw[i >> 5] >> (i & 31)) & 1u)) l[i] = -std::numeric_limits<float>::infinity();
  }
  // 3. The largest logit: the greedy choice, and the reference of the sampling weights.
  const int64_t amax = argmax_row(l, V);
  const float m = l[amax];
  int64_t token = amax;
  bool accepted = P.draft >= 0 && amax == P.draft;
  float* q_write = P.q_out >= 0 ? q_rows + P.q_out * V : nullptr;
  if (q_write && !(P.temperature > 0.f && std::isfinite(m))) {  // a greedy draft: q one-hot at it
    std::fill(q_write, q_write + V, 0.f);
    q_write[amax] = 1.f;
  }
  if (P.temperature > 0.f && std::isfinite(m)) {
    const Weights w{m, 1.f / P.temperature};
    const uint32_t kmax = order_key(m);
    uint32_t lo = 0;
    if (P.top_k > 0 && P.top_k < V) lo = select_key(l, V, 0, uint64_t(P.top_k), w, /*by_mass=*/false);
    const uint32_t topk_key = lo;
    if (P.min_p > 0.f) lo = std::max(lo, std::min(kmax, order_key(m + P.temperature * std::log(P.min_p))));
    uint32_t t = lo;
    if (P.top_p < 1.f) {  // over the probabilities normalised on the top-k set, cut from lo
      uint64_t mass_k = 0;
      for (int64_t i = 0; i < V; ++i)
        if (order_key(l[i]) >= topk_key) mass_k += w(l[i]);
      const uint64_t target = std::max<uint64_t>(static_cast<uint64_t>(double(P.top_p) * double(mass_k)), 1);
      t = std::max(lo, select_key(l, V, lo, target, w, /*by_mass=*/true));
    }
    const bool has_draft = P.draft >= 0 && P.draft < V;
    const uint64_t wd = has_draft && order_key(l[P.draft]) >= t ? w(l[P.draft]) : 0;
    uint64_t total = 0;
    for (int64_t i = 0; i < V; ++i)
      if (order_key(l[i]) >= t) total += w(l[i]);
    if (q_write)  // the distribution this row's draft is drawn from
      for (int64_t i = 0; i < V; ++i) q_write[i] = order_key(l[i]) >= t ? float(double(w(l[i])) / double(total)) : 0.f;
    const float* q = has_draft && P.draft_q >= 0 ? q_rows + P.draft_q * V : nullptr;
    int64_t exclude = -1;
    // A kept token's weight in the draw: w, or after refusing a draft drawn from q the residual
    // max(w - q * total, 0) (none for the draft: refused only where p(draft) < q(draft)).
    auto weight = [&](int64_t i) -> uint64_t {
      if (i == exclude || order_key(l[i]) < t) return 0;
      const uint64_t wi = w(l[i]);
      if (!q) return wi;
      const uint64_t qi = static_cast<uint64_t>(double(q[i]) * double(total));
      return wi > qi ? wi - qi : 0;
    };
    uint64_t target = 0;
    bool draw = true;
    if (q) {  // accept with probability min(1, p(draft) / q(draft)), else draw from the residual
      const bool take = row_uniform01(P.seed, P.draw, 0) * double(q[P.draft]) * double(total) < double(wd);
      exclude = P.draft;
      uint64_t rest = 0;
      for (int64_t i = 0; i < V && !take; ++i) rest += weight(i);
      if (take || rest == 0) {  // rest 0: p = q up to rounding
        token = P.draft, accepted = true, draw = false;
      } else {
        target = static_cast<uint64_t>(row_uniform01(P.seed, P.draw, 1) * double(rest));
      }
    } else if (has_draft) {  // accept the draft with probability p(draft), else draw from p without it
      if (row_uniform01(P.seed, P.draw, 0) * double(total) < double(wd) || total == wd) {
        token = P.draft, accepted = true, draw = false;
      } else {
        exclude = P.draft;
        target = static_cast<uint64_t>(row_uniform01(P.seed, P.draw, 1) * double(total - wd));
      }
    } else {  // j = 2 for a draft drawn here: apart from its position's own draws
      target = static_cast<uint64_t>(row_uniform01(P.seed, P.draw, q_write ? 2 : 0) * double(total));
    }
    if (draw) {  // inverse CDF over the kept tokens in id order
      accepted = false;
      token = amax;  // only if rounding left no owner
      uint64_t acc = 0;
      for (int64_t i = 0; i < V; ++i) {
        acc += weight(i);
        if (target < acc) {
          token = i;
          break;
        }
      }
    }
  }
  res.token = int32_t(token);
  res.accepted = accepted ? 1 : 0;
  if (P.logprobs >= 0) {
    float raw = l[token];
    for (int32_t a = P.adjust_begin; a < P.adjust_end; ++a)
      if (adjust[a].token == token) raw = adjust[a].raw;
    res.logprob = raw - res.lse;
  }
  return res;
}

}  // namespace

double row_uniform01(uint64_t seed, uint64_t draw, int j) {
  const uint64_t z = splitmix(seed ^ splitmix(draw * 4 + uint64_t(j)));
  return double(z >> 11) * (1.0 / 9007199254740992.0);
}

void sample_rows(float* logits, int64_t rows, int64_t vocab, const RowSampling* params, LogitAdjustment* adjust,
                 RowSample* out, int32_t* top_ids, float* top_logprobs, const uint32_t* masks, float* q_rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const RowSampling& P = params[r];
    if (P.skip) {
      out[r] = RowSample{};
      continue;
    }
    FATHOM_CHECK((P.q_out < 0 && P.draft_q < 0) || q_rows, "sample_rows: row ", r,
                 " draws or verifies a sampled draft, and no draft distributions were given");
    FATHOM_CHECK(P.q_out < 0 || P.draft < 0, "sample_rows: row ", r, " both draws a draft and verifies one");
    out[r] = sample_row(logits + r * vocab, vocab, P, adjust, top_ids ? top_ids + r * kMaxTopLogprobs : nullptr,
                        top_logprobs ? top_logprobs + r * kMaxTopLogprobs : nullptr, masks, q_rows);
  }
}

}  // namespace fathom::cpu
