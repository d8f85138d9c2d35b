#include "model/cuda/host_snapshot_pool.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

namespace {
constexpr int64_t kChunkBytes = int64_t(256) << 20;
}

HostSnapshotPool::~HostSnapshotPool() {
  for (char* c : chunks_) cudaFreeHost(c);
}

void HostSnapshotPool::configure(int64_t page_bytes, int64_t state_bytes, int64_t budget_bytes) {
  FATHOM_CHECK(page_bytes > 0 && page_bytes % 16 == 0 && state_bytes >= 0 && state_bytes % 16 == 0,
               "host snapshot pool: pages of ", page_bytes, " bytes and states of ", state_bytes,
               " bytes are not whole 16-byte vectors");
  FATHOM_CHECK(chunks_.empty(), "host snapshot pool: configured twice");
  page_bytes_ = page_bytes;
  state_bytes_ = state_bytes;
  budget_ = std::max<int64_t>(0, budget_bytes);
}

char* HostSnapshotPool::carve(int64_t bytes) {
  if (tail_left_ < bytes) {
    if (pinned_ >= budget_) return nullptr;
    const int64_t chunk = std::max(bytes, std::min(kChunkBytes, budget_ - pinned_));
    void* p = nullptr;
    // Mapped: the copy kernels address it with its host pointer (unified addressing).
    if (cudaHostAlloc(&p, size_t(chunk), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();  // not sticky: the tier stops growing, and moves past it are refused
      std::fprintf(stderr, "fathom: prefix cache host tier: could not pin %lld MB more; it stays at %lld MB\n",
                   (long long)(chunk >> 20), (long long)(pinned_ >> 20));
      budget_ = pinned_;
      return nullptr;
    }
    void* dev = nullptr;
    FATHOM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
    FATHOM_CHECK(dev == p, "host snapshot pool: pinned memory is not at the same address on the device");
    chunks_.push_back(static_cast<char*>(p));
    pinned_ += chunk;
    tail_ = static_cast<char*>(p);
    tail_left_ = chunk;  // what was left of the last chunk stays unused
  }
  char* piece = tail_;
  tail_ += bytes;
  tail_left_ -= bytes;
  return piece;
}

bool HostSnapshotPool::take(size_t pages, std::vector<char*>& page_out, char*& state_out) {
  page_out.clear();
  state_out = nullptr;
  auto undo = [&] {
    free_pages_.insert(free_pages_.end(), page_out.begin(), page_out.end());
    page_out.clear();
    if (state_out) free_states_.push_back(state_out);
    state_out = nullptr;
    return false;
  };
  if (state_bytes_ > 0) {
    if (!free_states_.empty()) {
      state_out = free_states_.back();
      free_states_.pop_back();
    } else if (!(state_out = carve(state_bytes_))) {
      return false;
    }
  }
  while (page_out.size() < pages) {
    if (!free_pages_.empty()) {
      page_out.push_back(free_pages_.back());
      free_pages_.pop_back();
    } else if (char* p = carve(page_bytes_)) {
      page_out.push_back(p);
    } else {
      return undo();
    }
  }
  return true;
}

void HostSnapshotPool::give_back(const std::vector<char*>& pages, char* state) {
  free_pages_.insert(free_pages_.end(), pages.begin(), pages.end());
  if (state) free_states_.push_back(state);
}

}  // namespace fathom::cuda
