// The device sampler's buffers (runner_sampling.cpp): each logits row's parameters and result,
// its top logprobs, the logit adjustments and token masks of the step, on the device and mirrored
// in pinned host memory. The pinned side is double-buffered (alternate launches): a launched
// step's copies may still be pending, and its results stay readable, while the next step is
// prepared. Adjustments and masks grow on demand.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/sampling.h"

namespace fathom::cuda {

struct SamplingBuffers {
  // row_params (and its pinned halves) and row_out hold twice the step's rows: a fused round's MTP
  // draft rows (and what they drew) follow its T verify rows, so one copy uploads both; only the
  // verify rows' samples come back (row_out_host).
  DeviceBuffer row_params, row_out, row_top_ids, row_top_lp, adjust_dev, mask_dev;
  RowSampling* row_params_host[2] = {};
  RowSample* row_out_host[2] = {};
  int32_t* row_top_ids_host[2] = {};
  float* row_top_lp_host[2] = {};
  LogitAdjustment* adjust_host[2] = {};
  size_t adjust_cap[2] = {};
  uint32_t* mask_host[2] = {};
  size_t mask_cap[2] = {};  // words
  // Raw logits rows a chunk returns (RowSampling::keep_logits: prompt ends for the prefix cache),
  // at most kMaxKeptRows a chunk: rows past it are not returned (their snapshots are dropped).
  static constexpr int kMaxKeptRows = 16;
  float* kept_host[2] = {};
  size_t kept_cap[2] = {};  // floats
  int io_buf = 0;           // the pinned half the next launch uses
  cudaEvent_t chunk_done[2] = {};  // per half: its chunk's results have arrived
  // The token each state slot's last sampled row chose (kPendingToken's value on the device).
  DeviceBuffer last_token;
  // Sampled MTP drafts in fused rounds (RowSampling::draw_draft): the q each draft row drew from
  // ([rows, vocab]), and each state slot's kept q ([slots, vocab], read by RowSampling::draft_q =
  // slot). Sized by the memory plan where the engine draws sampled drafts (reserve_sampled_drafts),
  // else at first use; a 248K vocabulary takes 1 MB a row.
  DeviceBuffer q_drawn, q_kept;
  size_t draft_rows = 0;  // rows q_drawn holds

  SamplingBuffers() = default;
  SamplingBuffers(const SamplingBuffers&) = delete;
  SamplingBuffers& operator=(const SamplingBuffers&) = delete;
  ~SamplingBuffers();

  // Room for `rows` logits rows a step and `slots` state slots.
  void allocate(int rows, int slots, cudaStream_t s);
  // Half `buf` holds at least `n` adjustments / `words` mask words (the device side: both halves' most).
  void reserve_adjustments(int buf, size_t n);
  void reserve_masks(int buf, size_t words);
  void reserve_kept(int buf, size_t floats);
  // Room for a fused round of `rows` rows drawing drafts, and `slots` kept distributions. Returns
  // whether a device buffer moved (a graph that holds the old addresses is stale).
  bool reserve_drafts(int rows, int slots, int64_t vocab);
};

// Packing a step's rows into the buffers above (the sampled launch and the MTP round): a row's
// adjustments and token mask must lie inside the caller's lists (`who` names the caller; a mask
// that comes later is not checked yet) ...
void check_row_lists(const RowSampling& r, std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                     int64_t mask_words, bool masks_later, const char* who);
// ... and its adjustments are appended at `next` of the pinned list `host`, the row renumbered to
// them; returns the list's new end.
int32_t append_adjustments(RowSampling& r, std::span<const LogitAdjustment> adjust, LogitAdjustment* host,
                           int32_t next);

}  // namespace fathom::cuda
