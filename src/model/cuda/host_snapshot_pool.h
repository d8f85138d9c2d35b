// The host tier's memory (--prefix-cache-host-gb) on the CUDA engine: pinned host memory, mapped
// into the device's address space so that copy kernels read and write it directly, handed out
// in two kinds of pieces: pages (one KV block of every pool, what a snapshot's block becomes
// there) and state pieces (one sequence's linear-attention states, every layer). The whole
// budget is pinned when the pool is configured, at start-up: pinning while serving (256 MB at a
// time as the tier filled) held the engine's thread ~70 ms a chunk, because the driver does not
// pin beside the device's work (docs/perf.md, issue 37, stop 62).
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

  // Pieces of `page_bytes` and `state_bytes` (multiples of 16) out of `budget_bytes` of host
  // memory, all of it faulted in and pinned now; what the system refuses to pin is left out (a
  // smaller tier, said on stderr).
  void configure(int64_t page_bytes, int64_t state_bytes, int64_t budget_bytes);

  // `pages` pages and a state piece (none when state_bytes is 0); false, and nothing taken, when
  // the budget cannot hold them.
  bool take(size_t pages, std::vector<char*>& page_out, char*& state_out);
  void give_back(const std::vector<char*>& pages, char* state);

  int64_t pinned_bytes() const { return pinned_; }
  int64_t page_bytes() const { return page_bytes_; }

 private:
  // `bytes` from the pinned region's unused tail; null when it is used up.
  char* carve(int64_t bytes);

  int64_t page_bytes_ = 0, state_bytes_ = 0, pinned_ = 0;
  char* base_ = nullptr;     // the mapping: mapped_ bytes, the first pinned_ of them registered
  int64_t mapped_ = 0;
  int64_t chunk_ = 0;        // bytes registered at a time; no piece straddles two registrations
  int64_t usable_ = 0;       // the budget, or what was pinned of it
  int64_t used_ = 0;         // bytes carved from the start of the pinned part
  std::vector<char*> free_pages_, free_states_;
};

}  // namespace fathom::cuda
