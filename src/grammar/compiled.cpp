#include "grammar/compiled.h"

#include "grammar/stack_pool.h"

namespace fathom::grammar {

namespace {

// Walks the vocabulary trie from stack (pos over kSentinel). A token is accepted when some path
// consumes it without needing the unknown rest of the stack, uncertain when the only paths
// continue past the end of the rule, rejected otherwise (whole subtrees are skipped).
CompiledGrammar::PositionTokens classify(StackPool& pool, const Vocabulary& vocab, uint32_t pos, size_t& visited) {
  const auto& trie = vocab.trie();
  std::vector<std::vector<uint32_t>> states(2);
  std::vector<uint8_t> past(2, 0);
  states[0] = {pool.make(pos, StackPool::kSentinel)};
  std::vector<uint32_t> accepted, uncertain;
  for (uint32_t k = 1; k < trie.size();) {
    const auto& nd = trie[k];
    size_t d = nd.depth;
    if (states.size() <= d) states.resize(d + 1), past.resize(d + 1);
    bool crossed = past[d - 1];
    pool.advance_set(states[d - 1], nd.byte, states[d], &crossed);
    past[d] = crossed;
    ++visited;
    if (!states[d].empty()) {
      for (uint32_t i = nd.lo; i < nd.lo + nd.n_end; ++i) accepted.push_back(vocab.sorted()[i]);
      ++k;
      continue;
    }
    if (crossed) uncertain.push_back(k);
    k += nd.subtree;
  }
  CompiledGrammar::PositionTokens out;
  out.uncertain = std::move(uncertain);
  if (accepted.size() < vocab.mask_words()) {
    out.accepted_ids = std::move(accepted);
  } else {
    out.accepted_bits.assign(vocab.mask_words(), 0);
    for (uint32_t id : accepted) out.accepted_bits[id >> 5] |= 1u << (id & 31);
    out.accepted_ids.clear();
  }
  return out;
}

}  // namespace

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      slots_(new std::atomic<const PositionTokens*>[grammar_->elems().size()]),
      pool_(std::make_unique<StackPool>(*grammar_)) {
  for (size_t i = 0; i < grammar_->elems().size(); ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

CompiledGrammar::~CompiledGrammar() = default;

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const Vocabulary> vocab) {
  auto cg = std::make_shared<CompiledGrammar>(std::move(grammar), std::move(vocab));
  const auto& elems = cg->grammar_->elems();
  size_t done = 0;
  for (uint32_t p = 0; p < elems.size() && done < kEagerPositions && cg->visited_ < kEagerTrieSteps; ++p)
    if (elems[p].kind == Grammar::Kind::Bytes) cg->classify_locked(p), ++done;
  return cg;
}

const CompiledGrammar::PositionTokens& CompiledGrammar::classify_locked(uint32_t pos) const {
  std::lock_guard lock(mu_);
  if (const PositionTokens* t = slots_[pos].load(std::memory_order_acquire)) return *t;
  owned_.push_back(std::make_unique<PositionTokens>(classify(*pool_, *vocab_, pos, visited_)));
  const PositionTokens& t = *owned_.back();
  stats_.positions++;
  for (uint32_t k : t.uncertain) stats_.uncertain += vocab_->trie()[k].hi - vocab_->trie()[k].lo;
  stats_.accepted += t.accepted_ids.size();
  for (uint32_t w : t.accepted_bits) stats_.accepted += __builtin_popcount(w);
  slots_[pos].store(&t, std::memory_order_release);
  return t;
}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace fathom::grammar
