// Generation over a ModelRunner, plain or speculative, for one prompt or a ragged batch.
//
// Each round, per sequence: the drafter proposes up to K tokens; ONE batched target forward runs
// [last token + drafts] for every sequence (keep_history, all rows); acceptance is greedy
// (draft == target argmax) at temperature 0 and rejection sampling otherwise (spec_sampling.h),
// so the output distribution is the target's exactly; the target token after the last accepted
// draft (correction or bonus) is emitted too; the sequence is rolled back to the accepted
// length; MTP drafters then re-run the accepted rows ("draft extend"). Sequences of different
// lengths share every forward and accept different counts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_runner.h"
#include "runtime/generate.h"
#include "runtime/spec_drafter.h"

namespace fathom {

enum class SpecAlgorithm { None, Mtp, Ngram };

struct SpecOptions {
  SpecAlgorithm algorithm = SpecAlgorithm::None;
  int num_steps = 3;  // K: drafts per round (SGLang --speculative-num-steps; chain, topk 1)
  int ngram_min = 1, ngram_max = 12;  // n-gram match window (SGLang defaults 1..12)
  // Tests: when set, every first MTP draft (made by a draft extend) is appended here.
  std::vector<MtpDrafter::Trace>* mtp_trace = nullptr;
};

// "none", "mtp", "nextn" (alias of mtp, as SGLang), "ngram" (case-insensitive).
SpecAlgorithm parse_spec_algorithm(const std::string& name);
const char* spec_algorithm_name(SpecAlgorithm a);

// One result per prompt. Sampling: sequence i uses seed opt.sampling.seed + i. Stop tokens and
// max_new_tokens behave as in generate(); drafts are cut so no round overshoots max_new_tokens.
// The runner's sequences are created and removed inside.
std::vector<GenerateResult> generate_batch(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt, const SpecOptions& spec = {});

GenerateResult generate(ModelRunner& runner, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                        const SpecOptions& spec = {});

}  // namespace fathom
