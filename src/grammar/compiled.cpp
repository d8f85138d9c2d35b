#include "grammar/compiled.h"

#include "grammar/stack_pool.h"

#include <algorithm>
#include <cstring>

namespace fathom::grammar {

namespace {

// Walks the vocabulary trie from the group's stacks (positions over kSentinel). A token is accepted when some path
// consumes it without needing the unknown rest of the stack, uncertain when the only paths
// continue past the end of the rule, rejected otherwise (whole subtrees are skipped).
CompiledGrammar::PositionTokens classify(StackPool& pool, const Vocabulary& vocab, std::span<const uint32_t> positions,
                                         size_t& visited) {
  const auto& trie = vocab.trie();
  std::vector<std::vector<uint32_t>> states(2);
  std::vector<uint8_t> past(2, 0);
  for (uint32_t pos : positions) states[0].push_back(pool.make(pos, StackPool::kSentinel));
  std::sort(states[0].begin(), states[0].end());
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
      single_(new std::atomic<const PositionTokens*>[grammar_->elems().size()]),
      pool_(std::make_unique<StackPool>(*grammar_)) {
  for (size_t i = 0; i < grammar_->elems().size(); ++i) single_[i].store(nullptr, std::memory_order_relaxed);
}

CompiledGrammar::~CompiledGrammar() = default;

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(std::shared_ptr<const Grammar> grammar,
                                                                std::shared_ptr<const Vocabulary> vocab) {
  auto cg = std::make_shared<CompiledGrammar>(std::move(grammar), std::move(vocab));
  const Grammar& g = *cg->grammar_;
  // Each rule's own group first (the alternatives a reference expands to), then single positions.
  for (uint32_t r = 0; r < g.num_rules() && cg->visited_ < kEagerTrieSteps; ++r) {
    std::vector<uint32_t> positions;
    for (uint32_t n : cg->pool_->start(r, StackPool::kSentinel))
      if (!cg->pool_->is_special(n) && cg->pool_->parent(n) == StackPool::kSentinel)
        positions.push_back(cg->pool_->pos(n));
    std::sort(positions.begin(), positions.end());
    positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
    if (positions.size() > 1) cg->group(positions);
  }
  for (uint32_t p = 0; p < g.elems().size() && cg->visited_ < kEagerTrieSteps; ++p)
    if (g.elems()[p].kind == Grammar::Kind::Bytes) cg->group(std::span<const uint32_t>(&p, 1));
  return cg;
}

std::string CompiledGrammar::key_of(std::span<const uint32_t> positions) {
  std::string key(positions.size() * sizeof(uint32_t), '\0');
  std::memcpy(key.data(), positions.data(), key.size());
  return key;
}

const CompiledGrammar::PositionTokens& CompiledGrammar::group(std::span<const uint32_t> positions) const {
  if (positions.size() == 1)
    if (const PositionTokens* t = single_[positions[0]].load(std::memory_order_acquire)) return *t;
  std::string key = key_of(positions);
  if (positions.size() > 1) {
    std::shared_lock lock(mu_);
    if (auto it = groups_.find(key); it != groups_.end()) return *it->second;
  }
  return classify_locked(positions, key);
}

const CompiledGrammar::PositionTokens& CompiledGrammar::classify_locked(std::span<const uint32_t> positions,
                                                                         const std::string& key) const {
  std::unique_lock lock(mu_);
  auto& slot = groups_[key];
  if (!slot) {
    slot = std::make_unique<PositionTokens>(classify(*pool_, *vocab_, positions, visited_));
    stats_.groups++;
    for (uint32_t k : slot->uncertain) stats_.uncertain += vocab_->trie()[k].hi - vocab_->trie()[k].lo;
    stats_.accepted += slot->accepted_ids.size();
    for (uint32_t w : slot->accepted_bits) stats_.accepted += __builtin_popcount(w);
    if (positions.size() == 1) single_[positions[0]].store(slot.get(), std::memory_order_release);
  }
  return *slot;
}

bool CompiledGrammar::find_mask(const std::string& key, uint32_t* words) const {
  std::shared_lock lock(mask_mu_);
  auto it = masks_.find(key);
  if (it == masks_.end()) return false;
  std::memcpy(words, it->second.data(), it->second.size() * sizeof(uint32_t));
  return true;
}

void CompiledGrammar::store_mask(const std::string& key, const uint32_t* words) const {
  const size_t n = vocab_->mask_words(), bytes = n * sizeof(uint32_t) + key.size();
  std::unique_lock lock(mask_mu_);
  if (mask_bytes_ + bytes > kSharedMaskBytes) {
    masks_.clear();
    mask_bytes_ = 0;
  }
  if (masks_.emplace(key, std::vector<uint32_t>(words, words + n)).second) mask_bytes_ += bytes;
}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::shared_lock lock(mu_);
  return stats_;
}

}  // namespace fathom::grammar
