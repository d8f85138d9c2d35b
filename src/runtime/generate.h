// Single-request generation on a HybridModel directly (chunked prefill, then decode step by step):
// the CPU model's reference that tests hold the engine's output to. Generation itself runs through
// the Engine (offline_generate.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/hybrid_model.h"
#include "runtime/offline_generate.h"

namespace fathom {

GenerateResult generate(const HybridModel& model, const std::vector<int32_t>& prompt, const GenerateOptions& opt);

// Runs the prompt through `state` in chunks of `chunk` tokens; returns the last chunk's output
// (all rows when `all_rows`, else the final row only, concatenated across chunks).
HybridModel::Output prefill(const HybridModel& model, SequenceState& state, const std::vector<int32_t>& prompt,
                            int chunk, bool all_rows);

}  // namespace fathom
