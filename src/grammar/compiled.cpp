#include "grammar/compiled.h"

#include "grammar/stack_pool.h"

namespace fathom::grammar {

namespace {

// Walks the vocabulary trie from stack (pos over kSentinel). A token is accepted when some path
// consumes it without needing the unknown rest of the stack, uncertain when the only paths
// continue past the end of the rule, rejected otherwise (whole subtrees are skipped).
CompiledGrammar::PositionTokens classify(StackPool& pool, const Vocabulary& vocab, uint32_t pos) {
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

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const Vocabulary> vocab) {
  auto cg = std::make_shared<CompiledGrammar>();
  cg->grammar_ = std::move(grammar);
  cg->vocab_ = std::move(vocab);
  const auto& elems = cg->grammar_->elems();
  cg->index_.assign(elems.size(), ~0u);
  StackPool pool(*cg->grammar_);
  for (uint32_t p = 0; p < elems.size(); ++p) {
    if (elems[p].kind != Grammar::Kind::Bytes) continue;
    cg->index_[p] = static_cast<uint32_t>(cg->tokens_.size());
    cg->tokens_.push_back(classify(pool, *cg->vocab_, p));
    const auto& t = cg->tokens_.back();
    cg->stats_.positions++;
    for (uint32_t k : t.uncertain) cg->stats_.uncertain += cg->vocab_->trie()[k].hi - cg->vocab_->trie()[k].lo;
    cg->stats_.accepted += t.accepted_ids.size();
    for (uint32_t w : t.accepted_bits) cg->stats_.accepted += __builtin_popcount(w);
  }
  return cg;
}

}  // namespace fathom::grammar
