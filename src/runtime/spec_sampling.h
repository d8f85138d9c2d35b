// Acceptance rules of speculative decoding that keep the target's output distribution exactly.
//
// Greedy (temperature 0): a draft is accepted while it equals the target's argmax; the first
// mismatch is replaced by the argmax (the "bonus" token after a fully accepted chain too).
// Sampling: draft d drawn from q is accepted with probability min(1, p(d) / q(d)); on rejection
// the token is drawn from normalize(max(p - q, 0)) (Leviathan et al. 2023, Chen et al. 2023).
// Drafts from the MTP layer (argmax chain) and from n-gram lookup are deterministic, i.e. q is
// one-hot: accept with probability p(d), else sample from p with d removed, renormalised.
// p is the target's distribution after temperature, top-k, min-p and top-p, as Sampler applies them.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/sampler.h"

namespace fathom {

// The distribution Sampler::sample draws from (temperature > 0), over all n tokens (zeros for
// the tokens the filters drop). For temperature <= 0: one-hot at argmax.
std::vector<double> target_distribution(const float* logits, int64_t n, const SamplingParams& params);

// Draws an index with probability proportional to w (w need not be normalised; sum must be > 0).
int32_t sample_from_weights(std::span<const double> w, std::mt19937_64& rng);

struct Acceptance {
  bool accepted = false;
  int32_t token = -1;  // the draft when accepted, else the replacement sample
};

// General rule: q is the draft distribution the draft was sampled from.
Acceptance rejection_sample(std::span<const double> p, std::span<const double> q, int32_t draft,
                            std::mt19937_64& rng);
// q = one-hot(draft): deterministic drafts (MTP argmax chain, n-grams).
Acceptance rejection_sample_deterministic(std::span<const double> p, int32_t draft, std::mt19937_64& rng);

// Verifies a deterministic draft against target logits (penalties already applied): greedy
// (temperature <= 0) accepts it when it is the argmax, else rejection sampling.
Acceptance verify_draft(const float* logits, int64_t n, const SamplingParams& params, int32_t draft,
                        std::mt19937_64& rng);

}  // namespace fathom
