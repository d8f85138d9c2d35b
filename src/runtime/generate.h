// Single-request generation on a HybridModel: chunked prefill, then decode step by step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/hybrid_model.h"
#include "runtime/sampler.h"
#include "runtime/spec_stats.h"

namespace fathom {

struct GenerateOptions {
  int max_new_tokens = 16;
  int prefill_chunk = 512;  // tokens per prefill forward
  SamplingParams sampling;
  std::vector<int> stop_token_ids;  // generation ends after emitting one of these
};

struct GenerateResult {
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "length" or "stop"
  int prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t target_forward_steps = 0;  // decode forwards of the target model (prefill not counted)
  bool speculative = false;          // spec below is filled (runtime/spec_decode.h)
  SpecStats spec;
};

GenerateResult generate(const HybridModel& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// Runs the prompt through `state` in chunks of `chunk` tokens; returns the last chunk's output
// (all rows when `all_rows`, else the final row only, concatenated across chunks).
HybridModel::Output prefill(const HybridModel& model, SequenceState& state, const std::vector<int32_t>& prompt,
                            int chunk, bool all_rows);

}  // namespace fathom
