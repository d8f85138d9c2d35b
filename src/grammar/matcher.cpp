#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace fathom::grammar {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar, size_t mask_cache)
    : grammar_(std::move(grammar)), pool_(grammar_->grammar()), cache_cap_(mask_cache) {
  reset();
}

void Matcher::reset() {
  history_.clear();
  history_.push_back({pool_.start(grammar_->grammar().root(), StackPool::kAccept), false});
}

bool Matcher::is_accepting() const {
  const auto& s = history_.back().stacks;
  return !s.empty() && s.front() == StackPool::kAccept;  // sorted: kAccept (0) comes first
}

bool Matcher::advance_bytes(std::string_view bytes, std::vector<uint32_t>& out) {
  tmp_a_ = history_.back().stacks;
  for (unsigned char c : bytes) {
    pool_.advance_set(tmp_a_, c, tmp_b_);
    if (tmp_b_.empty()) return false;
    std::swap(tmp_a_, tmp_b_);
  }
  out = tmp_a_;
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (is_terminated()) return false;
  std::vector<uint32_t> next;
  if (!advance_bytes(bytes, next)) return false;
  history_.push_back({std::move(next), false});
  return true;
}

bool Matcher::can_accept_bytes(std::string_view bytes) {
  std::vector<uint32_t> next;
  return !is_terminated() && advance_bytes(bytes, next);
}

bool Matcher::accept_token(uint32_t id) {
  const Vocabulary& v = vocab();
  if (id >= v.size() || is_terminated()) return false;
  const auto& stops = v.stop_ids();
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    if (!is_accepting()) return false;
    history_.push_back({history_.back().stacks, true});
    return true;
  }
  if (v.is_special(id)) return false;
  return accept_bytes(v.bytes(id));
}

void Matcher::rollback(size_t n) {
  FATHOM_CHECK(n <= num_steps(), "grammar matcher: rollback of ", n, " steps but only ", num_steps(), " taken");
  history_.resize(history_.size() - n);
}

void Matcher::fill_next_token_bitmask(std::span<uint32_t> words) {
  const Vocabulary& v = vocab();
  FATHOM_CHECK(words.size() >= v.mask_words(), "grammar matcher: mask of ", words.size(), " words, need ",
               v.mask_words());
  const Step& step = history_.back();
  std::fill(words.begin(), words.end(), 0u);
  if (step.terminated) {
    for (uint32_t id : v.stop_ids()) words[id >> 5] |= 1u << (id & 31);
    return;
  }
  for (const CachedMask& c : cache_) {
    if (c.key == step.stacks) {
      std::memcpy(words.data(), c.words.data(), c.words.size() * sizeof(uint32_t));
      return;
    }
  }
  if (cache_cap_ == 0) {
    compute_mask(step.stacks, words.data());
    return;
  }
  const std::string key = state_key(step.stacks);
  if (!grammar_->find_mask(key, words.data())) {
    compute_mask(step.stacks, words.data());
    grammar_->store_mask(key, words.data());
  }
  if (cache_.size() < cache_cap_) cache_.emplace_back();
  CachedMask& slot = cache_[cache_next_];
  cache_next_ = (cache_next_ + 1) % cache_cap_;
  slot.key = step.stacks;
  slot.words.assign(words.begin(), words.begin() + v.mask_words());
}

std::string Matcher::state_key(const std::vector<uint32_t>& stacks) const {
  std::vector<std::vector<uint32_t>> chains;
  for (uint32_t node : stacks) {
    std::vector<uint32_t>& c = chains.emplace_back();
    uint32_t n = node;
    for (; !pool_.is_special(n); n = pool_.parent(n)) c.push_back(pool_.pos(n));
    c.push_back(~0u - n);  // the bottom (kAccept or kSentinel), never a position: ends the chain
  }
  std::sort(chains.begin(), chains.end());
  std::string key;
  for (const auto& c : chains) key.append(reinterpret_cast<const char*>(c.data()), c.size() * sizeof(uint32_t));
  return key;
}

void Matcher::compute_mask(const std::vector<uint32_t>& stacks, uint32_t* words) {
  if (pool_.set_bytes() > kMaxSetBytes) pool_.clear_sets();  // between walks: no set id is held
  const Vocabulary& v = vocab();
  // Stacks sharing a parent form one group (one rule expansion): one lookup, one mask OR.
  tops_.clear();
  for (uint32_t node : stacks) {
    if (node == StackPool::kAccept) {
      for (uint32_t id : v.stop_ids()) words[id >> 5] |= 1u << (id & 31);
      continue;
    }
    tops_.push_back({pool_.parent(node), pool_.pos(node), node});
  }
  std::sort(tops_.begin(), tops_.end());
  for (size_t i = 0; i < tops_.size();) {
    size_t j = i;
    group_pos_.clear();
    group_nodes_.clear();
    for (; j < tops_.size() && tops_[j][0] == tops_[i][0]; ++j) {
      group_pos_.push_back(tops_[j][1]);
      group_nodes_.push_back(tops_[j][2]);
    }
    i = j;
    const CompiledGrammar::PositionTokens* t = grammar_->find_group(group_pos_);
    if (!t && grammar_->singles_classified(group_pos_)) {
      // A group met for the first time: the union of its positions' own tokens (classified at
      // compile time) instead of a classification walk now.
      for (size_t k = 0; k < group_pos_.size(); ++k)
        add_tokens(*grammar_->find_group({&group_pos_[k], 1}), {&group_nodes_[k], 1}, words);
      continue;
    }
    add_tokens(t ? *t : grammar_->group(group_pos_), group_nodes_, words);
  }
}

void Matcher::add_tokens(const CompiledGrammar::PositionTokens& t, std::span<const uint32_t> nodes, uint32_t* words) {
  if (!t.accepted_bits.empty()) {
    const uint32_t* src = t.accepted_bits.data();
    for (size_t k = 0, n = vocab().mask_words(); k < n; ++k) words[k] |= src[k];
  }
  for (uint32_t id : t.accepted_ids) words[id >> 5] |= 1u << (id & 31);
  if (!t.uncertain.empty()) add_uncertain(nodes, t.uncertain, words);
}

// Checks the context-dependent subtrees against the real stack: the states along the path to
// each subtree root are shared with the previous root (preorder), and inside a subtree a dead
// state skips the rest of it. States are the pool's set ids (memoized transitions).
void Matcher::add_uncertain(std::span<const uint32_t> nodes, const std::vector<uint32_t>& roots, uint32_t* words) {
  const Vocabulary& v = vocab();
  const auto& trie = v.trie();
  const auto& sorted = v.sorted();
  constexpr uint32_t kDead = StackPool::kEmptySet;
  if (depth_states_.empty()) depth_states_.resize(64);
  set_scratch_.assign(nodes.begin(), nodes.end());
  std::sort(set_scratch_.begin(), set_scratch_.end());
  depth_states_[0] = pool_.intern_set(set_scratch_);
  const std::string* path = nullptr;  // a token whose prefix depth_states_[1..valid] follow
  size_t valid = 0;
  for (uint32_t root : roots) {
    const std::string& s = v.bytes(sorted[trie[root].lo]);
    size_t top = trie[root].depth - 1;  // depth of the root's parent
    if (depth_states_.size() <= top + 1) depth_states_.resize(top + 2);
    size_t d = 0;
    if (path)
      while (d < valid && d < top && (*path)[d] == s[d]) ++d;
    for (; d < top && depth_states_[d] != kDead; ++d)
      depth_states_[d + 1] = pool_.advance_set_id(depth_states_[d], static_cast<uint8_t>(s[d]));
    path = &s;
    valid = d;
    if (d < top || depth_states_[top] == kDead) continue;
    for (uint32_t k = root, end = root + trie[root].subtree; k < end;) {
      const auto& nd = trie[k];
      if (depth_states_.size() <= nd.depth) depth_states_.resize(nd.depth + 1);
      depth_states_[nd.depth] = pool_.advance_set_id(depth_states_[nd.depth - 1], nd.byte);
      if (depth_states_[nd.depth] == kDead) {
        k += nd.subtree;
        continue;
      }
      for (uint32_t i = nd.lo; i < nd.lo + nd.n_end; ++i) words[sorted[i] >> 5] |= 1u << (sorted[i] & 31);
      ++k;
    }
  }
}

std::string Matcher::shortest_completion() const {
  const Grammar& g = grammar_->grammar();
  std::string best;
  bool found = false;
  for (uint32_t node : history_.back().stacks) {
    if (node == StackPool::kAccept) return {};
    uint64_t len = 0;
    for (uint32_t n = node; !pool_.is_special(n); n = pool_.parent(n)) len += g.min_suffix_len(pool_.pos(n));
    if (found && len >= best.size()) continue;
    std::string s;
    for (uint32_t n = node; !pool_.is_special(n); n = pool_.parent(n)) s += g.shortest_suffix(pool_.pos(n));
    best = std::move(s);
    found = true;
  }
  return best;
}

}  // namespace fathom::grammar
