// Offline generation (fathom generate, chat and bench; tests): prompts run to completion through
// the serving Engine (engine.h) on the caller's thread, on a runner the caller keeps. Plain or
// speculative (speculator.h): each decode step of a sequence verifies its drafts in the same
// batched forward as every other sequence's tokens, as in serving.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/spec_stats.h"
#include "runtime/speculator.h"

namespace fathom {

struct GenerateOptions {
  int max_new_tokens = 16;
  int prefill_chunk = 512;  // prompt tokens of one sequence per forward
  SamplingParams sampling;
  std::vector<int> stop_token_ids;  // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "length" or "stop"
  int prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t target_forward_steps = 0;  // decode forwards of the target model (prefill not counted)
  bool speculative = false;          // spec below is filled
  SpecStats spec;
};

// One result per prompt, all prompts batched. Sampling: sequence i uses seed opt.sampling.seed + i.
// Drafts are cut so no round overshoots max_new_tokens. The runner's sequences are created and
// removed inside.
std::vector<GenerateResult> generate_batch(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt, const SpecOptions& spec = {});

GenerateResult generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const SpecOptions& spec = {});

}  // namespace fathom
