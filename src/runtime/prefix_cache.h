// Prefix caching for hybrid models (issue 20). A Gated DeltaNet layer's state after a prefix is
// one fixed-size matrix per head that cannot be cut back to a shorter prefix, so the cache keeps
// snapshots of a sequence's whole state (ModelRunner::save_snapshot: KV, linear-attention states,
// the MTP layer's KV) at block-aligned positions, and a new prompt starts from the longest cached
// prefix that ends at one. Keys chain a hash over whole blocks (as vLLM's block hashes), so a
// lookup walks the prompt's blocks once; an entry's tokens are compared on a hit, so a hash
// collision never serves a wrong prefix. Entries go least recently used first once their bytes
// pass the capacity; the caller drops the evicted snapshots from the runner.
//
// Where to snapshot is learned: the cache remembers the block hashes of the prompts it has seen
// (hashes only, a bounded number), so a prompt sharing blocks with an earlier one knows where the
// shared part ends, the one position worth a snapshot that no chunk boundary need hit.
#pragma once
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fathom {

class PrefixCache {
 public:
  PrefixCache(int block_size, int64_t capacity_bytes);

  struct Hit {
    int64_t snapshot = 0;
    int64_t length = 0;  // tokens of the cached prefix; 0: none
    uint64_t key = 0;
  };
  // The chained hash of each whole block of `tokens`: element b covers blocks 0..b.
  std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens) const;
  // The longest cached prefix among the first hashes.size() blocks of `tokens` (find leaves the
  // recency alone; touch marks it used; lookup does both over at most `max_length` tokens).
  Hit find(std::span<const uint64_t> hashes, std::span<const int32_t> tokens) const;
  void touch(const Hit& hit);
  Hit lookup(std::span<const int32_t> tokens, int64_t max_length);
  // Blocks of the longest prefix (by hashes) an earlier remembered prompt had too; remember adds
  // a prompt's, the oldest going past kMaxSeen.
  int64_t seen_blocks(std::span<const uint64_t> hashes) const;
  void remember(std::span<const uint64_t> hashes);
  static constexpr size_t kMaxSeen = size_t(1) << 18;
  bool contains(std::span<const int32_t> prefix) const;
  bool contains(std::span<const int32_t> prefix, uint64_t hash) const;  // hash: its block_hashes().back()
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
  std::unordered_set<uint64_t> seen_;
  std::deque<uint64_t> seen_order_;
};

}  // namespace fathom
