// Prefix caching for hybrid models (issue 20). A Gated DeltaNet layer's state after a prefix is
// one fixed-size matrix per head that cannot be cut back to a shorter prefix, so the cache keeps
// snapshots of a sequence's whole state (ModelRunner::save_snapshot: KV, linear-attention states,
// the MTP layer's KV) at block-aligned positions, and a new prompt starts from the longest cached
// prefix that ends at one. Keys chain a hash over whole blocks (as vLLM's block hashes), so a
// lookup walks the prompt's blocks once; an entry's tokens are compared on a hit, so a hash
// collision never serves a wrong prefix. Entries go least recently used first once their bytes
// pass the capacity; the caller drops the evicted snapshots from the runner.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace fathom {

class PrefixCache {
 public:
  PrefixCache(int block_size, int64_t capacity_bytes);

  struct Hit {
    int64_t snapshot = 0;
    int64_t length = 0;  // tokens of the cached prefix; 0: none
  };
  // The longest cached prefix of `tokens` no longer than `max_length`; marks it recently used.
  Hit lookup(std::span<const int32_t> tokens, int64_t max_length);
  bool contains(std::span<const int32_t> prefix) const;
  // Adds the snapshot of `prefix` (whole blocks). Returns the snapshots the caller must drop: the
  // entries evicted to stay within the capacity, or the new one itself when the prefix is already
  // cached or the snapshot alone is larger than the capacity.
  std::vector<int64_t> insert(std::span<const int32_t> prefix, int64_t snapshot, int64_t bytes);
  std::vector<int64_t> clear();  // every snapshot, for the caller to drop
  int64_t evict_lru();           // the least recently used entry's snapshot (0: empty)

  int block_size() const { return block_size_; }
  int64_t bytes() const { return bytes_; }
  int64_t capacity_bytes() const { return capacity_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    int64_t snapshot = 0, bytes = 0;
    uint64_t last_used = 0;
  };
  // The chained hash of `tokens`' first `blocks` blocks, continuing from `h` after `from` blocks.
  uint64_t chain(std::span<const int32_t> tokens, int64_t from, int64_t blocks, uint64_t h) const;
  std::vector<int64_t> evict_to(int64_t capacity);

  int block_size_;
  int64_t capacity_;
  int64_t bytes_ = 0;
  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace fathom
