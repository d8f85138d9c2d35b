// Prefix caching for hybrid models (issue 20). A Gated DeltaNet layer's state after a prefix is
// one fixed-size matrix per head that cannot be cut back to a shorter prefix, so the cache keeps
// snapshots of a sequence's whole state (ModelRunner::save_snapshot: KV, linear-attention states,
// the MTP layer's KV) at block-aligned positions, and a new prompt starts from the longest cached
// prefix that ends at one. Keys chain a hash over whole blocks (as vLLM's block hashes), so a
// lookup walks the prompt's blocks once; an entry's tokens are compared on a hit, so a hash
// collision never serves a wrong prefix. Entries go least recently used first once their bytes
// pass the capacity (prompt ends, below, and block-aligned snapshots each keep up to half of it
// against the other kind); the caller drops the evicted snapshots from the runner.
//
// Where to snapshot is learned: the cache remembers the block hashes of the prompts it has seen
// (hashes only, a bounded number), so a prompt sharing blocks with an earlier one knows where the
// shared part ends, the one position worth a snapshot that no chunk boundary need hit.
//
// Prompt ends (issue 37): the state where a prompt's prefill ended, at any length, with the last
// position's logits (the first new token is chosen from them) and hidden state (the MTP layer's
// next input). An exact repeat of the prompt starts there with no forward at all; a longer prompt
// that begins with it prefills only the rest. Such entries are keyed by the hash of their whole
// blocks (as above) and the tokens after them, and listed under the whole blocks' hash, so a
// lookup still takes one probe per block of the prompt.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fathom {

// What a snapshot taken where a prompt's prefill ended carries besides the runner's state.
struct PromptEnd {
  std::vector<float> logits;  // [vocab] of the prompt's last position
  std::vector<float> hidden;  // [hidden] its final hidden state (for the MTP layer; else empty)
  int64_t bytes() const { return int64_t((logits.size() + hidden.size()) * sizeof(float)); }
};

class PrefixCache {
 public:
  PrefixCache(int block_size, int64_t capacity_bytes);

  // An entry taken out of the cache (evicted, refused, or taken for another tier): the caller
  // drops its snapshot or moves it to another tier's cache.
  struct Removed {
    int64_t snapshot = 0, snapshot_bytes = 0;
    std::vector<int32_t> tokens;
    std::shared_ptr<const PromptEnd> end;
    bool duplicate = false;  // the snapshot just offered, whose prefix is cached already
  };

  struct Hit {
    int64_t snapshot = 0;
    int64_t length = 0;  // tokens of the cached prefix; 0: none
    uint64_t key = 0;
    std::shared_ptr<const PromptEnd> end;  // set for a prompt end (length may equal the prompt's)
  };
  // The chained hash of each whole block of `tokens`: element b covers blocks 0..b.
  std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens) const;
  // The longest cached prefix of `tokens`: block-aligned snapshots among the first hashes.size()
  // blocks, and prompt ends of up to tokens.size() tokens (find leaves the recency alone; touch
  // marks it used; lookup does both over at most `max_length` tokens).
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
  // Adds the snapshot of `prefix` (whole blocks). Returns the entries the caller must drop or move
  // elsewhere: those evicted to stay within the capacity, or the new one itself when there is no
  // room for it (or, marked duplicate, when its prefix is cached already).
  std::vector<Removed> insert(std::span<const int32_t> prefix, int64_t snapshot, int64_t bytes);
  // The same for a prompt's end (any length >= 1); `bytes` counts the snapshot, `end` its own.
  // `blocks_hash`, when the caller has it, is prompt_blocks_hash() of the prompt's block_hashes()
  // (else it is computed: one pass over the prompt).
  std::vector<Removed> insert_prompt_end(std::span<const int32_t> prompt, int64_t snapshot, int64_t bytes,
                                         std::shared_ptr<const PromptEnd> end,
                                         std::optional<uint64_t> blocks_hash = std::nullopt);
  // A removed entry put back (into this cache or another tier's): insert or insert_prompt_end.
  std::vector<Removed> insert(Removed entry, int64_t snapshot);
  bool contains_prompt_end(std::span<const int32_t> prompt, std::optional<uint64_t> blocks_hash = std::nullopt) const;
  // The hash a prompt end is listed under: that of the whole blocks before its last token, given
  // the hashes of those blocks (block_hashes() of them; empty: none).
  static uint64_t prompt_blocks_hash(std::span<const uint64_t> hashes);
  std::vector<Removed> clear();  // every entry, for the caller to drop
  Removed evict_lru();           // the least recently used entry (snapshot 0: empty)
  Removed take(const Hit& hit);  // the hit's entry, out of the cache (snapshot 0: not there)

  int block_size() const { return block_size_; }
  int64_t bytes() const { return bytes_; }
  int64_t capacity_bytes() const { return capacity_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    int64_t snapshot = 0, bytes = 0;
    uint64_t last_used = 0;
    std::shared_ptr<const PromptEnd> end;  // prompt ends only
    uint64_t blocks_hash = 0;              // prompt ends: the hash of their whole blocks
  };
  using EntryMap = std::unordered_map<uint64_t, Entry>;
  // The chained hash of `tokens`' first `blocks` blocks, continuing from `h` after `from` blocks.
  uint64_t chain(std::span<const int32_t> tokens, int64_t from, int64_t blocks, uint64_t h) const;
  // A prompt end's key: the hash of its whole blocks (`blocks_hash`) continued over the rest.
  uint64_t end_key(std::span<const int32_t> prompt, uint64_t blocks_hash) const;
  // The longest prompt end listed under `blocks_hash` (whole blocks of `tokens`) that `tokens` begins with.
  Hit find_prompt_end(uint64_t blocks_hash, int64_t blocks, std::span<const int32_t> tokens) const;
  std::vector<Removed> add(uint64_t key, Entry e);  // (insert's second half) the entries removed
  Removed erase(EntryMap::iterator it);
  bool make_room(int64_t bytes, bool prompt_end, std::vector<Removed>& removed);  // false: no room for that kind

  int block_size_;
  int64_t capacity_;
  int64_t bytes_ = 0, end_bytes_ = 0;  // all entries', prompt ends'
  uint64_t clock_ = 0;
  EntryMap entries_;
  // Prompt ends by the hash of their whole blocks: how many are cached at each length past those
  // blocks (index 1..block size), so a lookup tries each length once, longest first, however many
  // prompts share the blocks.
  std::unordered_map<uint64_t, std::vector<int32_t>> end_tails_;
  std::unordered_set<uint64_t> seen_;
  std::deque<uint64_t> seen_order_;
};

}  // namespace fathom
