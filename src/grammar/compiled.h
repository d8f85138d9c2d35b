// A grammar prepared for one vocabulary: for every grammar position that can be the top of a
// stack, the tokens accepted whatever the rest of the stack is (context-independent), and the
// few whose fate depends on it (they cross the end of the position's rule and are checked
// against the real stack when a mask is built). Immutable; share one among all sequences.
#pragma once
#include <cstdint>
#include <memory>
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

  static std::shared_ptr<const CompiledGrammar> compile(std::shared_ptr<const Grammar> grammar,
                                                        std::shared_ptr<const Vocabulary> vocab);

  const Grammar& grammar() const { return *grammar_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // Tokens of a byte-set position (element index).
  const PositionTokens& at(uint32_t pos) const { return tokens_[index_[pos]]; }
  const Stats& stats() const { return stats_; }

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<uint32_t> index_;  // element -> tokens_
  std::vector<PositionTokens> tokens_;
  Stats stats_;
};

}  // namespace fathom::grammar
