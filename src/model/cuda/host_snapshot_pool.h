// The host tier's memory (--prefix-cache-host-gb) on the CUDA engine: pinned host memory, mapped
// into the device's address space so that copy kernels read and write it directly, handed out
// in two kinds of pieces: pages (one KV block of every pool, what a snapshot's block becomes
// there) and state pieces (one sequence's linear-attention states, every layer). It is pinned in
// chunks as the tier fills, never past the budget the engine set (but for one piece larger than what is left): pinning
// the whole budget at start-up would take seconds and memory that a small cache never uses.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fathom::cuda {

class HostSnapshotPool {
 public:
  HostSnapshotPool() = default;
  HostSnapshotPool(const HostSnapshotPool&) = delete;
  HostSnapshotPool& operator=(const HostSnapshotPool&) = delete;
  ~HostSnapshotPool();

  // Pieces of `page_bytes` and `state_bytes` (multiples of 16), at most `budget_bytes` pinned.
  void configure(int64_t page_bytes, int64_t state_bytes, int64_t budget_bytes);

  // `pages` pages and a state piece (none when state_bytes is 0); false, and nothing taken, when
  // the budget cannot hold them.
  bool take(size_t pages, std::vector<char*>& page_out, char*& state_out);
  void give_back(const std::vector<char*>& pages, char* state);

  int64_t pinned_bytes() const { return pinned_; }
  int64_t page_bytes() const { return page_bytes_; }

 private:
  // `bytes` from the current chunk's tail, pinning another chunk when it is used up; null when
  // the budget is reached.
  char* carve(int64_t bytes);

  int64_t page_bytes_ = 0, state_bytes_ = 0, budget_ = 0, pinned_ = 0;
  std::vector<char*> chunks_;
  char* tail_ = nullptr;
  int64_t tail_left_ = 0;
  std::vector<char*> free_pages_, free_states_;
};

}  // namespace fathom::cuda
