#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace fathom {

namespace {
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64 of the pair
  uint64_t z = h ^ (v + kSeed + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

PrefixCache::PrefixCache(int block_size, int64_t capacity_bytes) : block_size_(block_size), capacity_(capacity_bytes) {
  FATHOM_CHECK(block_size > 0, "prefix cache: block size ", block_size);
}

uint64_t PrefixCache::chain(std::span<const int32_t> tokens, int64_t from, int64_t blocks, uint64_t h) const {
  for (int64_t b = from; b < blocks; ++b) {
    for (int64_t i = b * block_size_; i < (b + 1) * block_size_; ++i) h = mix(h, uint64_t(uint32_t(tokens[size_t(i)])));
    h = mix(h, uint64_t(b + 1));  // block boundary
  }
  return h;
}

std::vector<uint64_t> PrefixCache::block_hashes(std::span<const int32_t> tokens) const {
  std::vector<uint64_t> hashes(tokens.size() / size_t(block_size_));
  uint64_t h = kSeed;
  for (size_t b = 0; b < hashes.size(); ++b) hashes[b] = h = chain(tokens, int64_t(b), int64_t(b) + 1, h);
  return hashes;
}

PrefixCache::Hit PrefixCache::find(std::span<const uint64_t> hashes, std::span<const int32_t> tokens) const {
  for (size_t b = hashes.size(); b-- > 0;) {
    auto it = entries_.find(hashes[b]);
    if (it == entries_.end()) continue;
    const Entry& e = it->second;
    const size_t n = (b + 1) * size_t(block_size_);
    if (e.tokens.size() == n && n <= tokens.size() && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
      return Hit{e.snapshot, int64_t(n), hashes[b]};
  }
  return {};
}

void PrefixCache::touch(const Hit& hit) {
  if (auto it = entries_.find(hit.key); hit.length > 0 && it != entries_.end()) it->second.last_used = ++clock_;
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_length) {
  const int64_t n = std::min<int64_t>(max_length, int64_t(tokens.size())) / block_size_ * block_size_;
  const Hit hit = find(block_hashes(tokens.first(size_t(std::max<int64_t>(n, 0)))), tokens);
  touch(hit);
  return hit;
}

int64_t PrefixCache::seen_blocks(std::span<const uint64_t> hashes) const {
  for (size_t b = hashes.size(); b-- > 0;)  // chained: block b seen means blocks 0..b were
    if (seen_.count(hashes[b])) return int64_t(b) + 1;
  return 0;
}

void PrefixCache::remember(std::span<const uint64_t> hashes) {
  for (uint64_t h : hashes)
    if (seen_.insert(h).second) seen_order_.push_back(h);
  while (seen_order_.size() > kMaxSeen) {
    seen_.erase(seen_order_.front());
    seen_order_.pop_front();
  }
}

bool PrefixCache::contains(std::span<const int32_t> prefix) const {
  if (prefix.empty() || prefix.size() % size_t(block_size_) != 0) return false;
  return contains(prefix, chain(prefix, 0, int64_t(prefix.size()) / block_size_, kSeed));
}

bool PrefixCache::contains(std::span<const int32_t> prefix, uint64_t hash) const {
  auto it = entries_.find(hash);
  return it != entries_.end() && std::equal(prefix.begin(), prefix.end(), it->second.tokens.begin(),
                                            it->second.tokens.end());
}

std::vector<int64_t> PrefixCache::insert(std::span<const int32_t> prefix, int64_t snapshot, int64_t bytes) {
  FATHOM_CHECK(!prefix.empty() && prefix.size() % size_t(block_size_) == 0, "prefix cache: a prefix of ",
               prefix.size(), " tokens is not whole blocks of ", block_size_);
  const uint64_t key = chain(prefix, 0, int64_t(prefix.size()) / block_size_, kSeed);
  if (bytes > capacity_ || contains(prefix, key)) return {snapshot};
  std::vector<int64_t> dropped;
  if (auto it = entries_.find(key); it != entries_.end()) {  // a collision: the newer prefix wins
    dropped.push_back(it->second.snapshot);
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  for (int64_t s : evict_to(capacity_ - bytes)) dropped.push_back(s);
  entries_[key] = Entry{std::vector<int32_t>(prefix.begin(), prefix.end()), snapshot, bytes, ++clock_};
  bytes_ += bytes;
  return dropped;
}

std::vector<int64_t> PrefixCache::evict_to(int64_t capacity) {
  std::vector<int64_t> dropped;
  while (bytes_ > capacity && !entries_.empty()) dropped.push_back(evict_lru());
  return dropped;
}

std::vector<int64_t> PrefixCache::clear() { return evict_to(-1); }

int64_t PrefixCache::evict_lru() {
  if (entries_.empty()) return 0;
  auto lru = std::min_element(entries_.begin(), entries_.end(),
                              [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
  const int64_t snapshot = lru->second.snapshot;
  bytes_ -= lru->second.bytes;
  entries_.erase(lru);
  return snapshot;
}

}  // namespace fathom
