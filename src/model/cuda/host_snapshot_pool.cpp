#include "model/cuda/host_snapshot_pool.h"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

namespace {
constexpr int64_t kHugePage = int64_t(2) << 20;
constexpr int64_t kRegisterBytes = int64_t(1) << 30;  // registered a chunk at a time: a refusal keeps the rest

// Touches every page of [p, p + bytes) on several threads: faulting in and zeroing is most of
// what pinning costs, and the kernel does it on the faulting thread.
void fault_in(char* p, int64_t bytes) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  const int64_t slice = (bytes / threads + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<std::thread> pool;
  for (int64_t at = 0; at < bytes; at += slice)
    pool.emplace_back([p, at, n = std::min(slice, bytes - at)] { std::memset(p + at, 0, size_t(n)); });
  for (std::thread& t : pool) t.join();
}
}  // namespace

HostSnapshotPool::~HostSnapshotPool() {
  for (int64_t at = 0; at < pinned_; at += chunk_) cudaHostUnregister(base_ + at);
  if (base_) munmap(base_, size_t(mapped_));
}

void HostSnapshotPool::configure(int64_t page_bytes, int64_t state_bytes, int64_t budget_bytes) {
  FATHOM_CHECK(page_bytes > 0 && page_bytes % 16 == 0 && state_bytes >= 0 && state_bytes % 16 == 0,
               "host snapshot pool: pages of ", page_bytes, " bytes and states of ", state_bytes,
               " bytes are not whole 16-byte vectors");
  FATHOM_CHECK(!base_, "host snapshot pool: configured twice");
  page_bytes_ = page_bytes;
  state_bytes_ = state_bytes;
  const int64_t budget = std::max<int64_t>(0, budget_bytes);
  if (budget == 0) return;
  // A copy (cudaMemcpy2DAsync of the states) may not span two registrations: pieces stay inside
  // one, and one registration holds the largest piece.
  const auto huge = [](int64_t n) { return (n + kHugePage - 1) / kHugePage * kHugePage; };
  chunk_ = huge(std::max({kRegisterBytes, page_bytes, state_bytes}));
  const int64_t mapped = huge(budget);
  const auto t0 = std::chrono::steady_clock::now();
  void* p = mmap(nullptr, size_t(mapped), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  FATHOM_CHECK(p != MAP_FAILED, "--prefix-cache-host-gb: could not map ", mapped >> 20, " MB of host memory");
  base_ = static_cast<char*>(p);
  mapped_ = mapped;
  madvise(base_, size_t(mapped), MADV_HUGEPAGE);  // fewer faults and page-table entries; a hint
  fault_in(base_, mapped);
  const auto t1 = std::chrono::steady_clock::now();
  while (pinned_ < mapped) {
    const int64_t n = std::min(chunk_, mapped - pinned_);
    // Mapped: the copy kernels address it with its host pointer (unified addressing).
    if (cudaHostRegister(base_ + pinned_, size_t(n), cudaHostRegisterMapped | cudaHostRegisterPortable) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky: the tier is what was pinned so far
      std::fprintf(stderr, "fathom: prefix cache host tier: could not pin past %lld MB of %lld\n",
                   (long long)(pinned_ >> 20), (long long)(mapped >> 20));
      break;
    }
    void* dev = nullptr;
    FATHOM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, base_ + pinned_, 0));
    FATHOM_CHECK(dev == base_ + pinned_, "host snapshot pool: pinned memory is not at the same address on the device");
    pinned_ += n;
  }
  usable_ = std::min(budget, pinned_);
  if (pinned_ < mapped_) {  // the unpinned tail goes back to the system
    munmap(base_ + pinned_, size_t(mapped_ - pinned_));
    mapped_ = pinned_;
    if (pinned_ == 0) base_ = nullptr;
  }
  const auto t2 = std::chrono::steady_clock::now();
  using Seconds = std::chrono::duration<double>;
  std::fprintf(stderr, "fathom: prefix cache host tier: %lld MB pinned in %.1f s (faulted in %.1f s, registered %.1f s)\n",
               (long long)(pinned_ >> 20), Seconds(t2 - t0).count(), Seconds(t1 - t0).count(),
               Seconds(t2 - t1).count());
}

char* HostSnapshotPool::carve(int64_t bytes) {
  int64_t at = used_;
  if (at / chunk_ != (at + bytes - 1) / chunk_) at = (at / chunk_ + 1) * chunk_;  // the next registration
  if (at + bytes > usable_) return nullptr;
  used_ = at + bytes;
  return base_ + at;
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
