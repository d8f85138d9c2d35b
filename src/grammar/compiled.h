// A grammar prepared for one vocabulary: for every grammar position that can be the top of a
// stack, the tokens accepted whatever the rest of the stack is (context-independent), and the
// few whose fate depends on it (they cross the end of the position's rule and are checked
// against the real stack when a mask is built). Shared by all sequences (thread-safe). Grammars
// with many positions (long counted repetitions) classify the rest lazily, on first use.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/vocab.h"

namespace fathom::grammar {

class CompiledGrammar {
 public:
  struct PositionTokens {
    std::vector<uint32_t> accepted_ids;   // when sparse
    std::vector<uint32_t> accepted_bits;  // when dense: a full mask
    // Trie nodes (preorder, ascending) whose whole subtree depends on the rest of the stack.
    std::vector<uint32_t> uncertain;
  };
  struct Stats {
    size_t positions = 0, accepted = 0, uncertain = 0;  // uncertain: tokens under uncertain nodes
  };

  // Positions classified at compile time: in order, until this many positions or trie steps
  // (~100 ms at a 150K vocabulary); the others wait for their first use.
  static constexpr size_t kEagerPositions = 2048;
  static constexpr size_t kEagerTrieSteps = 2'000'000;

  static std::shared_ptr<const CompiledGrammar> compile(std::shared_ptr<const Grammar> grammar,
                                                        std::shared_ptr<const Vocabulary> vocab);
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);
  ~CompiledGrammar();

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // Tokens of a byte-set position (element index).
  const PositionTokens& at(uint32_t pos) const {
    const PositionTokens* t = slots_[pos].load(std::memory_order_acquire);
    return t ? *t : classify_locked(pos);
  }
  // Counts over the positions classified so far.
  Stats stats() const;

 private:
  const PositionTokens& classify_locked(uint32_t pos) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<std::atomic<const PositionTokens*>[]> slots_;  // per element
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<PositionTokens>> owned_;
  mutable std::unique_ptr<class StackPool> pool_;
  mutable Stats stats_;
  mutable size_t visited_ = 0;  // trie steps of all classifications
};

}  // namespace fathom::grammar
