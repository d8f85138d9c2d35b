#include "grammar/compiled.h"

#include "grammar/stack_pool.h"

#include <algorithm>
#include <cstring>

namespace fathom::grammar {

namespace {

// The classification pool's memoized sets may grow to this before a classification starts them
// afresh.
constexpr size_t kMaxClassifySetBytes = size_t(64) << 20;

// Walks the vocabulary trie from the group's stacks (positions over kSentinel). A token is
// accepted when some path consumes it without needing the unknown rest of the stack, uncertain
// when the only paths continue past the end of the rule, rejected otherwise (whole subtrees are
// skipped).
CompiledGrammar::PositionTokens classify(StackPool& pool, const Vocabulary& vocab, std::span<const uint32_t> positions,
                                         size_t& visited) {
  // States as the pool's set ids: a walk meets the same (set, byte) pairs at most nodes, so
  // each costs a memoized lookup.
  if (pool.set_bytes() > kMaxClassifySetBytes) pool.clear_sets();
  std::vector<uint32_t> states(2);
  std::vector<uint8_t> past(2, 0);
  {
    std::vector<uint32_t> start;
    for (uint32_t pos : positions) start.push_back(pool.make(pos, StackPool::kSentinel));
    std::sort(start.begin(), start.end());
    states[0] = pool.intern_set(start);
  }
  std::vector<uint32_t> accepted, uncertain;
  const auto& child_begin = vocab.child_begin();
  const auto& child_node = vocab.child_node();
  const auto& child_byte = vocab.child_byte();
  // Depth-first over the children lists (preorder, so uncertain nodes come out ascending): a
  // child whose byte the state cannot take is passed over without reading its node, unless the
  // path has crossed the rule's end (then it is an uncertain node). An explicit stack: a path is
  // as deep as the longest token.
  struct Frame {
    uint32_t next, end;  // the node's children still to visit
    bool crossed;        // some state on the path held the sentinel (the rule could have ended)
  };
  std::vector<Frame> stack;
  auto enter = [&](uint32_t node, size_t d) {
    if (states.size() <= d + 1) states.resize(d + 2), past.resize(d + 2);
    stack.push_back({child_begin[node], child_begin[node + 1], past[d] || pool.set_has_sentinel(states[d])});
  };
  enter(0, 0);
  while (!stack.empty()) {
    const size_t d = stack.size() - 1;
    Frame& f = stack.back();
    if (f.next == f.end) {
      stack.pop_back();
      continue;
    }
    const uint32_t i = f.next++;
    const bool crossed = f.crossed;
    ++visited;
    const bool takes = pool.set_takes(states[d], child_byte[i]);
    if (!takes && !crossed) continue;
    const uint32_t next = takes ? pool.advance_set_id(states[d], child_byte[i]) : StackPool::kEmptySet;
    const uint32_t k = child_node[i];
    const auto& nd = vocab.trie()[k];
    if (next == StackPool::kEmptySet) {
      uncertain.push_back(k);  // crossed
      continue;
    }
    for (uint32_t t = nd.lo; t < nd.lo + nd.n_end; ++t) accepted.push_back(vocab.sorted()[t]);
    states[d + 1] = next;
    past[d + 1] = crossed;
    enter(k, d + 1);
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

const CompiledGrammar::PositionTokens* CompiledGrammar::find_group(std::span<const uint32_t> positions) const {
  if (positions.size() == 1) return single_[positions[0]].load(std::memory_order_acquire);
  std::shared_lock lock(mu_);
  auto it = groups_.find(key_of(positions));
  return it == groups_.end() ? nullptr : it->second.get();
}

bool CompiledGrammar::singles_classified(std::span<const uint32_t> positions) const {
  for (uint32_t p : positions)
    if (!single_[p].load(std::memory_order_acquire)) return false;
  return true;
}

const CompiledGrammar::PositionTokens& CompiledGrammar::group(std::span<const uint32_t> positions) const {
  if (const PositionTokens* t = find_group(positions)) return *t;
  return classify_locked(positions, key_of(positions));
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
