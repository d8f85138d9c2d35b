#include "grammar/stack_pool.h"

#include <algorithm>

namespace fathom::grammar {

void U64Map::rehash(size_t cap) {
  std::vector<uint64_t> old_keys = std::move(keys_), old_vals = std::move(vals_);
  keys_.assign(cap, kEmpty);
  vals_.assign(cap, 0);
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i)
    if (old_keys[i] != kEmpty) insert(old_keys[i], old_vals[i]);
}

void U64Map::insert(uint64_t key, uint64_t val) {
  if ((size_ + 1) * 2 > keys_.size()) rehash(keys_.size() * 2);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      vals_[i] = val;
      ++size_;
      return;
    }
    if (keys_[i] == key) {
      vals_[i] = val;
      return;
    }
  }
}

namespace {
const ByteSet kNoBytes{};
}

StackPool::StackPool(const Grammar& g) : g_(&g) {
  top_sets_.resize(g.elems().size(), &kNoBytes);
  for (size_t i = 0; i < g.elems().size(); ++i)
    if (g.elems()[i].kind == Grammar::Kind::Bytes) top_sets_[i] = &g.sets()[g.elems()[i].arg];
  nodes_.push_back({~0u, ~0u});  // kAccept
  nodes_.push_back({~0u, ~0u});  // kSentinel
  clear_sets();
}

uint32_t StackPool::make(uint32_t pos, uint32_t parent) {
  uint64_t key = (uint64_t{pos} << 32) | parent;
  if (const uint64_t* v = node_ids_.find(key)) return static_cast<uint32_t>(*v);
  auto id = static_cast<uint32_t>(nodes_.size());
  nodes_.push_back({pos, parent});
  node_ids_.insert(key, id);
  return id;
}

void StackPool::closure(uint32_t node, std::vector<uint32_t>& out) {
  ++gen_;
  closure_rec(node, out);
}

void StackPool::closure_rec(uint32_t node, std::vector<uint32_t>& out) {
  if (is_special(node)) {
    out.push_back(node);
    return;
  }
  if (mark_.size() < nodes_.size()) mark_.resize(nodes_.size() * 2, 0);
  if (mark_[node] == gen_) return;
  mark_[node] = gen_;
  const auto& elems = g_->elems();
  uint32_t p = nodes_[node].pos;
  switch (elems[p].kind) {
    case Grammar::Kind::Bytes:
      out.push_back(node);
      return;
    case Grammar::Kind::End:
      closure_rec(nodes_[node].parent, out);
      return;
    case Grammar::Kind::Ref: {
      uint32_t parent = nodes_[node].parent;
      // A reference last in its alternative is a tail call: return straight to the parent.
      uint32_t ret = elems[p + 1].kind == Grammar::Kind::End ? parent : make(p + 1, parent);
      for (uint32_t alt : g_->alts(elems[p].arg)) closure_rec(make(alt, ret), out);
      return;
    }
  }
}

std::span<const uint32_t> StackPool::advance(uint32_t node, uint8_t b) {
  uint64_t key = (uint64_t{node} << 8) | b;
  if (const uint64_t* v = advance_memo_.find(key))
    return {results_.data() + (*v >> 32), static_cast<size_t>(*v & 0xFFFFFFFF)};
  scratch_.clear();
  closure(make(nodes_[node].pos + 1, nodes_[node].parent), scratch_);
  std::sort(scratch_.begin(), scratch_.end());
  scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
  uint64_t off = results_.size();
  results_.insert(results_.end(), scratch_.begin(), scratch_.end());
  advance_memo_.insert(key, (off << 32) | scratch_.size());
  return {results_.data() + off, scratch_.size()};
}

void StackPool::advance_set(std::span<const uint32_t> in, uint8_t b, std::vector<uint32_t>& out,
                            bool* past_sentinel) {
  out.clear();
  size_t runs = 0;
  for (uint32_t n : in) {
    if (is_special(n)) {
      if (n == kSentinel && past_sentinel) *past_sentinel = true;
      continue;
    }
    if (!top_accepts(n, b)) continue;
    auto next = advance(n, b);
    out.insert(out.end(), next.begin(), next.end());
    ++runs;
  }
  if (runs > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

uint32_t StackPool::intern_set(std::span<const uint32_t> sorted_stacks) {
  if (sorted_stacks.empty()) return kEmptySet;
  std::string key(reinterpret_cast<const char*>(sorted_stacks.data()), sorted_stacks.size() * sizeof(uint32_t));
  auto [it, fresh] = set_ids_.try_emplace(std::move(key), static_cast<uint32_t>(set_range_.size()));
  if (fresh) {
    set_range_.push_back((uint64_t{set_data_.size()} << 32) | sorted_stacks.size());
    set_data_.insert(set_data_.end(), sorted_stacks.begin(), sorted_stacks.end());
    set_sentinel_.push_back(std::binary_search(sorted_stacks.begin(), sorted_stacks.end(), kSentinel) ? 1 : 0);
    ByteSet first;
    for (uint32_t n : sorted_stacks)
      if (!is_special(n))
        for (int i = 0; i < 4; ++i) first.w[i] |= top_sets_[nodes_[n].pos]->w[i];
    set_first_.push_back(first);
  }
  return it->second;
}

uint32_t StackPool::advance_set_id(uint32_t id, uint8_t b) {
  // Most bytes of a trie walk die at once: no lookup, no memo entry for them.
  if (id == kEmptySet || !set_first_[id].test(b)) return kEmptySet;
  const uint64_t key = (uint64_t{id} << 8) | b;
  if (const uint64_t* v = set_advance_.find(key)) return static_cast<uint32_t>(*v);
  advance_set(set_stacks(id), b, set_scratch_);  // reads set_data_, appends nothing to it
  const uint32_t next = intern_set(set_scratch_);
  set_advance_.insert(key, next);
  return next;
}

void StackPool::clear_sets() {
  set_data_.clear();
  set_range_.assign(1, 0);  // id 0: the empty set
  set_sentinel_.assign(1, 0);
  set_first_.assign(1, ByteSet{});
  set_ids_.clear();
  set_advance_ = U64Map();
}

std::vector<uint32_t> StackPool::start(uint32_t rule, uint32_t bottom) {
  std::vector<uint32_t> out;
  ++gen_;
  for (uint32_t alt : g_->alts(rule)) closure_rec(make(alt, bottom), out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace fathom::grammar
