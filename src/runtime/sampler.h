// Token selection from logits: greedy (temperature 0) or sampling with temperature, top-k,
// top-p and min-p, from a per-request seeded generator so results are reproducible.
// Penalties (repetition, frequency, presence) follow vLLM/HF semantics and, with OpenAI's logit
// bias, are applied to a copy of the logits before selection; logprobs are reported from the raw
// (unadjusted) logits.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace fathom {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy
  int top_k = 0;            // 0 or -1: off
  float top_p = 1.f;
  float min_p = 0.f;
  uint64_t seed = 0;
  float presence_penalty = 0.f;    // subtracted once from every logit of a token already generated
  float frequency_penalty = 0.f;   // subtracted count times (count in the generated tokens)
  float repetition_penalty = 1.f;  // HF style over prompt + generated tokens: l>0 ? l/r : l*r
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's: added to the token's logit
};

// Index of the largest logit; ties go to the lowest index (as torch.argmax).
int32_t argmax(const float* logits, int64_t n);

// Applies the penalties and the logit bias of `p` in place. Presence/frequency use `output` only,
// repetition uses `prompt` and `output` (as vLLM); the bias is added last.
void apply_logit_adjustments(float* logits, int64_t n, const SamplingParams& p, std::span<const int32_t> prompt,
                     std::span<const int32_t> output);

// log_softmax(logits)[token] and the `k` most likely tokens with their log-probabilities
// (descending, ties to the lower id).
struct TokenLogprobs {
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprobs compute_logprobs(const float* logits, int64_t n, int32_t token, int k);

// The tokens sampling may pick and their probabilities: softmax(logits / temperature), then top-k,
// min-p and top-p, most likely first (ties to the lower id), renormalised over the kept tokens.
// temperature must be > 0. Shared by Sampler and speculative rejection sampling.
struct SamplingCandidates {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};
SamplingCandidates sampling_candidates(const float* logits, int64_t n, const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {}
  int32_t sample(const float* logits, int64_t n);
  // Copies the logits, applies the penalties when any is set, then samples.
  int32_t sample(const float* logits, int64_t n, std::span<const int32_t> prompt, std::span<const int32_t> output);
  const SamplingParams& params() const { return params_; }
  bool adjusts_logits() const;  // penalties or a logit bias
  std::mt19937_64& rng() { return rng_; }  // also drives speculative rejection sampling

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> scratch_;
};

}  // namespace fathom
