// Token choice on the device: one block per logits row applies the row's adjustments, then picks
// greedily, samples (temperature, top-k, min-p, top-p) or verifies a deterministic draft by
// rejection sampling, or a draft drawn from q with min(1, p / q) and the residual max(p - q, 0)
// (RowSampling::draft_q), draws a draft and writes its q (RowSampling::q_out), and reports the
// chosen token's logprob and the top-k alternatives when asked. The CPU sampler
// (runtime/sampler.h) is the reference; core/row_sampling.h has the semantics.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#include "core/row_sampling.h"

namespace fathom::cuda {

// Rows of up to this many ids are staged in shared memory, where the sampler's passes over them
// cost less than a launch of argmax_rows (so a round need not take the argmax for it).
inline constexpr int kSampleRowsStagedVocab = 12288;

// logits [rows, vocab] are changed in place (adjustments). `adjust` holds every row's entries
// (their `raw` fields are written). top_ids / top_logprobs: [rows, kMaxTopLogprobs].
// last_token (may be null): [slots] tokens chosen per state slot (RowSampling::state_slot).
// masks (may be null): the rows' token masks (RowSampling::mask_row), mask_words(vocab) words each.
// row_argmax (may be null): argmax_rows' result on these logits; greedy rows with nothing to
// apply (no logprobs, adjustments or mask) take it instead of reading their row, and other rows
// without adjustments or a mask start from it.
// q_rows (may be null when no row has q_out or draft_q): the step's draft distributions, [n, vocab].
// tokens (may be null): [rows] each row's chosen token as a plain id (a fused round's next input).
// programmatic: launched with programmatic dependent launch where launch() is on (inside a round's
// graph, after kernels); off where the row parameters were just copied, as in a sampled step.
void sample_rows(float* logits, int rows, int vocab, const RowSampling* params, LogitAdjustment* adjust,
                 RowSample* out, int32_t* top_ids, float* top_logprobs, cudaStream_t s,
                 int32_t* last_token = nullptr, const uint32_t* masks = nullptr,
                 const int32_t* row_argmax = nullptr, float* q_rows = nullptr, int32_t* tokens = nullptr,
                 bool programmatic = false);

// Tests: the top-k and top-p cut-offs by bisection over keys (the reference form: a pass over the
// row for each bit of the key) instead of by bins (two passes). The same keys either way.
void set_sampling_cutoffs_by_bisection(bool on);

}  // namespace fathom::cuda
