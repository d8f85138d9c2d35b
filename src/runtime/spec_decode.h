// Generation over a ModelRunner, plain or speculative, for one prompt or a ragged batch.
//
// Each round, per sequence: the drafter proposes up to K tokens (fewer, or none, as the adaptive
// draft length of spec_policy.h decides); ONE batched target forward runs
// [last token + drafts] for every sequence (keep_history, all rows); acceptance is greedy
// (draft == target argmax) at temperature 0 and rejection sampling otherwise (spec_sampling.h),
// so the output distribution is the target's exactly; the target token after the last accepted
// draft (correction or bonus) is emitted too; the sequence is rolled back to the accepted
// length; the target rows of the accepted tokens go to the MTP layer's draft extend
// (speculator.h). Sequences of different lengths share every forward and accept different counts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_runner.h"
#include "runtime/generate.h"
#include "runtime/speculator.h"

namespace fathom {

// One result per prompt. Sampling: sequence i uses seed opt.sampling.seed + i. Stop tokens and
// max_new_tokens behave as in generate(); drafts are cut so no round overshoots max_new_tokens.
// The runner's sequences are created and removed inside.
std::vector<GenerateResult> generate_batch(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt, const SpecOptions& spec = {});

GenerateResult generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const SpecOptions& spec = {});

}  // namespace fathom
