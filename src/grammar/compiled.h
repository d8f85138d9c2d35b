// A grammar prepared for one vocabulary. The stacks of a matcher state that share a parent are
// the alternatives of one rule expansion; for such a group of grammar positions, it keeps the
// tokens accepted whatever the rest of the stack is (context-independent), and the trie
// subtrees whose tokens cross the end of the rule (checked against the real stack when a mask
// is built). Each rule's own group and the single positions are classified at compile time
// (within a budget); a group met later is the union of its positions' tokens when all of them
// were classified, else classified on first use. Shared by all sequences (thread-safe).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocab.h"

namespace fathom::grammar {

class StackPool;

class CompiledGrammar {
 public:
  struct PositionTokens {
    std::vector<uint32_t> accepted_ids;   // when sparse
    std::vector<uint32_t> accepted_bits;  // when dense: a full mask
    // Trie nodes (preorder, ascending) whose whole subtree depends on the rest of the stack.
    std::vector<uint32_t> uncertain;
  };
  struct Stats {
    size_t groups = 0, accepted = 0, uncertain = 0;  // uncertain: tokens under uncertain nodes
  };

  // Compile-time classification stops after this many trie steps (children tested; ~70 ms at
  // a 248K vocabulary, enough for every single position of the Kubernetes schemas in perf.md).
  static constexpr size_t kEagerTrieSteps = 5'000'000;

  static std::shared_ptr<const CompiledGrammar> compile(std::shared_ptr<const Grammar> grammar,
                                                        std::shared_ptr<const Vocabulary> vocab);
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);
  ~CompiledGrammar();

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // Tokens of a group of byte-set positions (sorted, unique) over one common parent.
  const PositionTokens& group(std::span<const uint32_t> positions) const;
  // The group's tokens if already classified, else null (no classification).
  const PositionTokens* find_group(std::span<const uint32_t> positions) const;
  // Whether every position has its own classification (a group's tokens are their union).
  bool singles_classified(std::span<const uint32_t> positions) const;
  // Counts over the groups classified so far.
  Stats stats() const;

  // Whole-state masks shared by every matcher of this grammar (requests repeat a schema and pass
  // through the same states): `key` is a state's stacks written as position chains
  // (Matcher::state_key). Kept up to kSharedMaskBytes, then started afresh.
  static constexpr size_t kSharedMaskBytes = size_t(32) << 20;
  bool find_mask(const std::string& key, uint32_t* words) const;
  void store_mask(const std::string& key, const uint32_t* words) const;

 private:
  struct KeyHash {
    size_t operator()(const std::string& k) const { return std::hash<std::string>()(k); }
  };
  const PositionTokens& classify_locked(std::span<const uint32_t> positions, const std::string& key) const;
  static std::string key_of(std::span<const uint32_t> positions);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<std::atomic<const PositionTokens*>[]> single_;  // per element: the group {pos}
  mutable std::shared_mutex mu_;
  mutable std::unordered_map<std::string, std::unique_ptr<PositionTokens>, KeyHash> groups_;
  mutable std::unique_ptr<StackPool> pool_;
  mutable Stats stats_;
  mutable size_t visited_ = 0;  // trie steps of all classifications
  mutable std::shared_mutex mask_mu_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>, KeyHash> masks_;
  mutable size_t mask_bytes_ = 0;
};

}  // namespace fathom::grammar
