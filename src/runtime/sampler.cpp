#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <vector>

namespace fathom {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

void apply_logit_adjustments(float* logits, int64_t n, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output) {
  if (p.repetition_penalty != 1.f && p.repetition_penalty > 0.f) {
    std::vector<char> seen(size_t(n), 0);
    for (int32_t t : prompt)
      if (t >= 0 && t < n) seen[t] = 1;
    for (int32_t t : output)
      if (t >= 0 && t < n) seen[t] = 1;
    for (int64_t i = 0; i < n; ++i)
      if (seen[i]) logits[i] = logits[i] > 0 ? logits[i] / p.repetition_penalty : logits[i] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : output)
      if (t >= 0 && t < n) ++counts[t];
    for (auto [t, c] : counts) logits[t] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }
  for (auto [t, bias] : p.logit_bias)
    if (t >= 0 && t < n) logits[t] += bias;
}

TokenLogprobs compute_logprobs(const float* logits, int64_t n, int32_t token, int k) {
  TokenLogprobs r;
  float mx = logits[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (token >= 0 && token < n) r.logprob = float(logits[token] - lse);
  k = int(std::min<int64_t>(std::max(k, 0), n));
  if (k > 0) {
    std::vector<int32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < k; ++i) r.top.emplace_back(idx[i], float(logits[idx[i]] - lse));
  }
  return r;
}

bool Sampler::adjusts_logits() const {
  return params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f || params_.repetition_penalty != 1.f ||
         !params_.logit_bias.empty();
}

int32_t Sampler::sample(const float* logits, int64_t n, std::span<const int32_t> prompt,
                        std::span<const int32_t> output) {
  if (!adjusts_logits()) return sample(logits, n);
  scratch_.assign(logits, logits + n);
  apply_logit_adjustments(scratch_.data(), n, params_, prompt, output);
  return sample(scratch_.data(), n);
}

SamplingCandidates sampling_candidates(const float* logits, int64_t n, const SamplingParams& params) {
  // Masked tokens (-inf: min_tokens, a grammar) have no probability: only the others are sorted,
  // which under a grammar is often a handful instead of the vocabulary. The candidates and their
  // probabilities are those of sorting every token.
  std::vector<int32_t> idx;
  idx.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    if (logits[i] != -std::numeric_limits<float>::infinity()) idx.push_back(int32_t(i));
  if (idx.empty()) {  // all masked: as before, every token (the first wins)
    idx.resize(size_t(n));
    std::iota(idx.begin(), idx.end(), 0);
  }
  n = int64_t(idx.size());
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  int64_t keep = n;
  if (params.top_k > 0) keep = std::min<int64_t>(keep, params.top_k);
  std::vector<double> p(keep);
  const double mx = logits[idx[0]] / params.temperature;
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp(logits[idx[i]] / params.temperature - mx);
  for (double& v : p) v /= sum;
  if (params.min_p > 0.f) {
    const double floor = params.min_p * p[0];
    while (keep > 1 && p[keep - 1] < floor) --keep;
  }
  if (params.top_p < 1.f) {
    double c = 0;
    int64_t k = 0;
    while (k < keep) {
      c += p[k++];
      if (c >= params.top_p) break;
    }
    keep = std::max<int64_t>(1, k);
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  SamplingCandidates out;
  out.ids.assign(idx.begin(), idx.begin() + keep);
  out.probs.resize(keep);
  for (int64_t i = 0; i < keep; ++i) out.probs[i] = p[i] / kept;
  return out;
}

int32_t Sampler::sample(const float* logits, int64_t n) {
  if (params_.temperature <= 0.f) return argmax(logits, n);
  const SamplingCandidates c = sampling_candidates(logits, n, params_);
  std::discrete_distribution<int64_t> dist(c.probs.begin(), c.probs.end());
  return c.ids[dist(rng_)];
}

}  // namespace fathom
