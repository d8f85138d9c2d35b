#include "model/cuda/sampling_buffers.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

SamplingBuffers::~SamplingBuffers() {
  for (int b = 0; b < 2; ++b)
    for (void* p : {(void*)row_params_host[b], (void*)row_out_host[b], (void*)row_top_ids_host[b],
                    (void*)row_top_lp_host[b], (void*)adjust_host[b], (void*)mask_host[b], (void*)kept_host[b]})
      if (p) cudaFreeHost(p);
  for (cudaEvent_t e : chunk_done)
    if (e) cudaEventDestroy(e);
}

void SamplingBuffers::allocate(int rows, int slots, cudaStream_t s) {
  row_params = DeviceBuffer(size_t(2 * rows) * sizeof(RowSampling));
  row_out = DeviceBuffer(size_t(2 * rows) * sizeof(RowSample));
  row_top_ids = DeviceBuffer(size_t(rows) * kMaxTopLogprobs * 4);
  row_top_lp = DeviceBuffer(size_t(rows) * kMaxTopLogprobs * 4);
  for (int b = 0; b < 2; ++b) {
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_params_host[b], size_t(2 * rows) * sizeof(RowSampling)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_out_host[b], size_t(rows) * sizeof(RowSample)));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_ids_host[b], size_t(rows) * kMaxTopLogprobs * 4));
    FATHOM_CUDA_CHECK(cudaMallocHost(&row_top_lp_host[b], size_t(rows) * kMaxTopLogprobs * 4));
  }
  last_token = DeviceBuffer(size_t(slots) * 4);
  FATHOM_CUDA_CHECK(cudaMemsetAsync(last_token.data(), 0, last_token.bytes(), s));
  for (cudaEvent_t& e : chunk_done) FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

void SamplingBuffers::reserve_adjustments(int buf, size_t n) {
  if (n > adjust_cap[buf]) {
    if (adjust_host[buf]) cudaFreeHost(adjust_host[buf]);
    adjust_cap[buf] = std::max<size_t>(n, 2 * adjust_cap[buf]);
    FATHOM_CUDA_CHECK(cudaMallocHost(&adjust_host[buf], adjust_cap[buf] * sizeof(LogitAdjustment)));
  }
  if (n * sizeof(LogitAdjustment) > adjust_dev.bytes())
    adjust_dev = DeviceBuffer(std::max(adjust_cap[0], adjust_cap[1]) * sizeof(LogitAdjustment));
}

void SamplingBuffers::reserve_masks(int buf, size_t words) {
  if (words > mask_cap[buf]) {
    if (mask_host[buf]) cudaFreeHost(mask_host[buf]);
    mask_cap[buf] = std::max<size_t>(words, 2 * mask_cap[buf]);
    FATHOM_CUDA_CHECK(cudaMallocHost(&mask_host[buf], mask_cap[buf] * 4));
  }
  if (words * 4 > mask_dev.bytes()) mask_dev = DeviceBuffer(std::max(mask_cap[0], mask_cap[1]) * 4);
}

void SamplingBuffers::reserve_kept(int buf, size_t floats) {
  if (floats <= kept_cap[buf]) return;
  if (kept_host[buf]) cudaFreeHost(kept_host[buf]);
  kept_cap[buf] = floats;
  FATHOM_CUDA_CHECK(cudaMallocHost(&kept_host[buf], floats * 4));
}

bool SamplingBuffers::reserve_drafts(int rows, int slots, int64_t vocab) {
  bool moved = false;
  if (size_t(rows) > draft_rows) {
    draft_rows = std::max<size_t>(size_t(rows), 2 * draft_rows);
    q_drawn = DeviceBuffer(draft_rows * size_t(vocab) * 4);
    moved = true;
  }
  if (q_kept.bytes() == 0) q_kept = DeviceBuffer(size_t(slots) * size_t(vocab) * 4), moved = true;
  return moved;
}

void check_row_lists(const RowSampling& r, std::span<const LogitAdjustment> adjust, std::span<const uint32_t> masks,
                     int64_t mask_words, bool masks_later, const char* who) {
  FATHOM_CHECK(r.adjust_begin >= 0 && r.adjust_begin <= r.adjust_end && size_t(r.adjust_end) <= adjust.size(), who,
               ": a row's adjustments lie outside the list");
  FATHOM_CHECK(r.mask_row < 0 || masks_later || int64_t(r.mask_row + 1) * mask_words <= int64_t(masks.size()), who,
               ": a row's token mask lies outside the mask table");
}

int32_t append_adjustments(RowSampling& r, std::span<const LogitAdjustment> adjust, LogitAdjustment* host,
                           int32_t next) {
  const int32_t count = r.adjust_end - r.adjust_begin;
  std::copy_n(adjust.begin() + r.adjust_begin, count, host + next);
  r.adjust_begin = next;
  r.adjust_end = next + count;
  return next + count;
}

}  // namespace fathom::cuda
