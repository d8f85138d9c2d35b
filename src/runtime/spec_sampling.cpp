#include "runtime/spec_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace fathom {

std::vector<double> target_distribution(const float* logits, int64_t n, const SamplingParams& params) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  if (params.temperature <= 0.f) {
    out[size_t(argmax(logits, n))] = 1.0;
    return out;
  }
  const SamplingCandidates c = sampling_candidates(logits, n, params);  // as Sampler::sample
  for (size_t i = 0; i < c.ids.size(); ++i) out[size_t(c.ids[i])] = c.probs[i];
  return out;
}

int32_t sample_from_weights(std::span<const double> w, std::mt19937_64& rng) {
  double total = 0;
  for (double v : w) total += v;
  FATHOM_CHECK(total > 0, "sample_from_weights: all weights are zero");
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng) * total;
  double c = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] <= 0) continue;
    c += w[i];
    last = int32_t(i);
    if (u < c) return last;
  }
  return last;  // rounding at the top end
}

Acceptance rejection_sample(std::span<const double> p, std::span<const double> q, int32_t draft,
                            std::mt19937_64& rng) {
  FATHOM_CHECK(p.size() == q.size() && draft >= 0 && size_t(draft) < p.size(), "rejection_sample: bad arguments");
  const double pd = p[size_t(draft)], qd = q[size_t(draft)];
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  // qd == 0 cannot happen for a draft drawn from q; accept only if the target allows it.
  if (qd <= 0 ? pd > 0 : u * qd < pd) return {true, draft};
  std::vector<double> residual(p.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += residual[i] = std::max(p[i] - q[i], 0.0);
  if (total <= 0) return {false, sample_from_weights(p, rng)};  // p == q: unreachable in exact arithmetic
  return {false, sample_from_weights(residual, rng)};
}

Acceptance verify_draft(const float* logits, int64_t n, const SamplingParams& params, int32_t draft,
                        std::mt19937_64& rng) {
  if (params.temperature <= 0.f) {
    const int32_t t = argmax(logits, n);
    return Acceptance{t == draft, t};
  }
  return rejection_sample_deterministic(target_distribution(logits, n, params), draft, rng);
}

Acceptance rejection_sample_deterministic(std::span<const double> p, int32_t draft, std::mt19937_64& rng) {
  FATHOM_CHECK(draft >= 0 && size_t(draft) < p.size(), "rejection_sample: draft outside the vocabulary");
  const double pd = p[size_t(draft)];
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  if (u < pd) return {true, draft};
  // max(p - onehot(d), 0) = p with p(d) set to 0.
  std::vector<double> residual(p.begin(), p.end());
  residual[size_t(draft)] = 0;
  double total = 0;
  for (double v : residual) total += v;
  if (total <= 0) return {true, draft};  // p(d) == 1 up to rounding
  return {false, sample_from_weights(residual, rng)};
}

}  // namespace fathom
