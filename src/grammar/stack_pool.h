// Hash-consed parse stacks of the pushdown automaton. A stack is a node (grammar position to
// match next, parent node); equal stacks share one id, so a matcher state is a small sorted set
// of ids and byte transitions can be memoized per (node, byte).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace fathom::grammar {

// Open-addressing map from non-max uint64 keys to uint64 values (the hot path of the matcher).
class U64Map {
 public:
  U64Map() { rehash(1024); }
  const uint64_t* find(uint64_t key) const {
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }
  void insert(uint64_t key, uint64_t val);
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  void rehash(size_t cap);
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class StackPool {
 public:
  static constexpr uint32_t kAccept = 0;    // the empty stack: the input so far is complete
  static constexpr uint32_t kSentinel = 1;  // an unknown rest of stack (context-free precompute)

  explicit StackPool(const Grammar& g);
  const Grammar& grammar() const { return *g_; }

  uint32_t make(uint32_t pos, uint32_t parent);
  uint32_t pos(uint32_t node) const { return nodes_[node].pos; }
  uint32_t parent(uint32_t node) const { return nodes_[node].parent; }
  bool is_special(uint32_t node) const { return node <= kSentinel; }
  // Whether the byte set on top of `node` (not special) contains b.
  bool top_accepts(uint32_t node, uint8_t b) const { return top_sets_[nodes_[node].pos]->test(b); }

  // Appends the closure of `node`: stacks whose top is a byte set, or kAccept / kSentinel.
  void closure(uint32_t node, std::vector<uint32_t>& out);
  // The closed, sorted stacks after `node` (whose top accepts b) matches b. Memoized; the span
  // is valid until the next call.
  std::span<const uint32_t> advance(uint32_t node, uint8_t b);
  // Advances a sorted set of stacks by one byte into `out` (sorted, unique). Sets *past_sentinel
  // when a stack of `in` is kSentinel (the byte would be matched by the unknown context).
  void advance_set(std::span<const uint32_t> in, uint8_t b, std::vector<uint32_t>& out,
                   bool* past_sentinel = nullptr);
  // Closed start stacks of rule `rule` over `bottom` (kAccept or kSentinel), sorted.
  std::vector<uint32_t> start(uint32_t rule, uint32_t bottom);
  size_t size() const { return nodes_.size(); }

  // Sets of stacks as ids with memoized byte transitions: a trie walk meets the same few (set,
  // byte) pairs at most of its nodes, so each costs a lookup instead of a merge and sort (a DFA
  // over the automaton's configurations, built as the walks need it). kEmptySet is the empty
  // set. Ids stay valid until clear_sets(), which callers call between walks once set_bytes()
  // passes their limit.
  static constexpr uint32_t kEmptySet = 0;
  uint32_t intern_set(std::span<const uint32_t> sorted_stacks);
  std::span<const uint32_t> set_stacks(uint32_t id) const {
    return {set_data_.data() + (set_range_[id] >> 32), static_cast<size_t>(set_range_[id] & 0xFFFFFFFF)};
  }
  bool set_has_sentinel(uint32_t id) const { return set_sentinel_[id] != 0; }  // a stack of it is kSentinel
  uint32_t advance_set_id(uint32_t id, uint8_t b);  // the id of advance_set(set_stacks(id), b)
  // Whether some stack of set `id` takes byte b (else advance_set_id gives kEmptySet).
  bool set_takes(uint32_t id, uint8_t b) const { return set_first_[id].test(b); }
  size_t set_bytes() const { return set_data_.size() * sizeof(uint32_t) + set_ids_.size() * (64 + sizeof(ByteSet)); }
  void clear_sets();

 private:
  struct Node {
    uint32_t pos, parent;
  };
  void closure_rec(uint32_t node, std::vector<uint32_t>& out);

  const Grammar* g_;
  std::vector<const ByteSet*> top_sets_;  // per element: its byte set, or an empty set
  std::vector<Node> nodes_;
  U64Map node_ids_;
  U64Map advance_memo_;  // (node << 8 | byte) -> (offset << 32 | length) in results_
  std::vector<uint32_t> results_;
  std::vector<uint32_t> mark_;  // closure visit marks by node, == gen_ when visited
  uint32_t gen_ = 0;
  std::vector<uint32_t> scratch_;
  std::vector<uint32_t> set_data_;     // the interned sets, concatenated
  std::vector<uint64_t> set_range_;    // per set id: offset << 32 | length in set_data_
  std::vector<uint8_t> set_sentinel_;  // per set id: holds kSentinel
  std::vector<ByteSet> set_first_;     // per set id: the bytes some stack of it accepts next
  std::unordered_map<std::string, uint32_t> set_ids_;  // a set's bytes -> its id
  U64Map set_advance_;                 // (id << 8 | byte) -> id
  std::vector<uint32_t> set_scratch_;
};

}  // namespace fathom::grammar
