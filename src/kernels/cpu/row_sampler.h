// Token choice per logits row with the device sampler's semantics (core/row_sampling.h,
// kernels/cuda/sampling.cu) on the CPU: adjustments, grammar mask, greedy or temperature with
// top-k / min-p / top-p over fixed-point weights, a deterministic draft accepted with probability
// p(draft) (else drawn from p without it), a draft drawn from q accepted with min(1, p / q) (else
// drawn from max(p - q, 0)), logprobs from the raw row. Random numbers are the same
// function of (seed, draw, j) as the device's, so an engine over a host-logits runner runs the
// serving engine's device-sampling path (runner-side choices, overlapped launches) as the GPU
// does; host and device may still part where exp() rounds differently at a weight's last bit.
#pragma once
#include <cstdint>

#include "core/row_sampling.h"

namespace fathom::cpu {

// Uniform in [0, 1) from (seed, draw, j) alone (the device's splitmix construction).
double row_uniform01(uint64_t seed, uint64_t draw, int j);

// As cuda::sample_rows: logits [rows, vocab] are changed in place (adjustments, mask); `adjust`
// holds every row's entries (their `raw` fields are written); top_ids / top_logprobs are
// [rows, kMaxTopLogprobs] (may be null when no row asks for logprobs); masks (may be null) are
// the rows' token masks, mask_words(vocab) words each. Skipped rows get a default RowSample.
// q_rows (may be null when no row has q_out or draft_q): the step's draft distributions, [n, vocab]
// floats: rows with q_out write theirs, rows with draft_q read theirs (RowSampling).
void sample_rows(float* logits, int64_t rows, int64_t vocab, const RowSampling* params, LogitAdjustment* adjust,
                 RowSample* out, int32_t* top_ids, float* top_logprobs, const uint32_t* masks = nullptr,
                 float* q_rows = nullptr);

}  // namespace fathom::cpu
