#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace fathom {

namespace {
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kPromptEndMark = 0x5e1f00d000000000ull;  // sets a prompt end's key apart from a block's
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

// Longest first: the prompt ends listed under q whole blocks are longer than the block snapshot
// of those q blocks and no longer than the one of q + 1 blocks.
PrefixCache::Hit PrefixCache::find(std::span<const uint64_t> hashes, std::span<const int32_t> tokens) const {
  for (size_t q = hashes.size() + 1; q-- > 0;) {
    if (const Hit end = find_prompt_end(q == 0 ? kSeed : hashes[q - 1], int64_t(q), tokens); end.length > 0)
      return end;
    if (q == 0) break;
    auto it = entries_.find(hashes[q - 1]);
    if (it == entries_.end()) continue;
    const Entry& e = it->second;
    const size_t n = q * size_t(block_size_);
    if (e.tokens.size() == n && n <= tokens.size() && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
      return Hit{e.snapshot, int64_t(n), hashes[q - 1], e.end};
  }
  return {};
}

PrefixCache::Hit PrefixCache::find_prompt_end(uint64_t blocks_hash, int64_t blocks,
                                              std::span<const int32_t> tokens) const {
  auto tails = end_tails_.find(blocks_hash);
  if (tails == end_tails_.end()) return {};
  const int64_t most = std::min<int64_t>(block_size_, int64_t(tokens.size()) - blocks * block_size_);
  for (int64_t rem = most; rem >= 1; --rem) {
    if (tails->second[size_t(rem)] == 0) continue;
    const std::span<const int32_t> prompt = tokens.first(size_t(blocks * block_size_ + rem));
    const uint64_t key = end_key(prompt, blocks_hash);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.end && std::equal(prompt.begin(), prompt.end(), it->second.tokens.begin(),
                                                             it->second.tokens.end()))
      return Hit{it->second.snapshot, int64_t(prompt.size()), key, it->second.end};
  }
  return {};
}

uint64_t PrefixCache::prompt_blocks_hash(std::span<const uint64_t> hashes) {
  return hashes.empty() ? kSeed : hashes.back();
}

uint64_t PrefixCache::end_key(std::span<const int32_t> prompt, uint64_t h) const {
  for (size_t i = (prompt.size() - 1) / size_t(block_size_) * size_t(block_size_); i < prompt.size(); ++i)
    h = mix(h, uint64_t(uint32_t(prompt[i])));
  return mix(h, kPromptEndMark + prompt.size());
}

void PrefixCache::touch(const Hit& hit) {
  if (auto it = entries_.find(hit.key); hit.length > 0 && it != entries_.end()) it->second.last_used = ++clock_;
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_length) {
  const size_t len = size_t(std::clamp<int64_t>(max_length, 0, int64_t(tokens.size())));
  const Hit hit = find(block_hashes(tokens.first(len)), tokens.first(len));
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

namespace {
PrefixCache::Removed refused(std::span<const int32_t> tokens, int64_t snapshot, int64_t bytes,
                             std::shared_ptr<const PromptEnd> end, bool duplicate) {
  return PrefixCache::Removed{snapshot, bytes, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(end),
                              duplicate};
}
}  // namespace

std::vector<PrefixCache::Removed> PrefixCache::insert(std::span<const int32_t> prefix, int64_t snapshot,
                                                      int64_t bytes) {
  FATHOM_CHECK(!prefix.empty() && prefix.size() % size_t(block_size_) == 0, "prefix cache: a prefix of ",
               prefix.size(), " tokens is not whole blocks of ", block_size_);
  const uint64_t key = chain(prefix, 0, int64_t(prefix.size()) / block_size_, kSeed);
  if (contains(prefix, key)) return {refused(prefix, snapshot, bytes, nullptr, true)};
  if (bytes > capacity_) return {refused(prefix, snapshot, bytes, nullptr, false)};
  return add(key, Entry{std::vector<int32_t>(prefix.begin(), prefix.end()), snapshot, bytes, 0, nullptr, 0});
}

std::vector<PrefixCache::Removed> PrefixCache::insert_prompt_end(std::span<const int32_t> prompt, int64_t snapshot,
                                                                 int64_t bytes, std::shared_ptr<const PromptEnd> end,
                                                                 std::optional<uint64_t> hash) {
  FATHOM_CHECK(!prompt.empty() && end, "prefix cache: a prompt end needs a prompt and its last position");
  const int64_t blocks = (int64_t(prompt.size()) - 1) / block_size_;
  const uint64_t blocks_hash = hash ? *hash : chain(prompt, 0, blocks, kSeed);
  if (contains_prompt_end(prompt, blocks_hash)) return {refused(prompt, snapshot, bytes, end, true)};
  if (bytes + end->bytes() > capacity_) return {refused(prompt, snapshot, bytes, end, false)};
  const uint64_t key = end_key(prompt, blocks_hash);
  Entry e{std::vector<int32_t>(prompt.begin(), prompt.end()), snapshot, bytes + end->bytes(), 0, end, blocks_hash};
  std::vector<Removed> removed = add(key, std::move(e));
  if (entries_.count(key)) {
    std::vector<int32_t>& counts = end_tails_[blocks_hash];
    counts.resize(size_t(block_size_) + 1, 0);
    ++counts[size_t(int64_t(prompt.size()) - blocks * block_size_)];
  }
  return removed;
}

std::vector<PrefixCache::Removed> PrefixCache::insert(Removed entry, int64_t snapshot) {
  return entry.end ? insert_prompt_end(entry.tokens, snapshot, entry.snapshot_bytes, std::move(entry.end))
                   : insert(entry.tokens, snapshot, entry.snapshot_bytes);
}

PrefixCache::Removed PrefixCache::take(const Hit& hit) {
  auto it = entries_.find(hit.key);
  if (hit.length == 0 || it == entries_.end() || it->second.snapshot != hit.snapshot) return {};
  return erase(it);
}

bool PrefixCache::contains_prompt_end(std::span<const int32_t> prompt, std::optional<uint64_t> hash) const {
  if (prompt.empty()) return false;
  const uint64_t blocks_hash = hash ? *hash : chain(prompt, 0, (int64_t(prompt.size()) - 1) / block_size_, kSeed);
  auto it = entries_.find(end_key(prompt, blocks_hash));
  return it != entries_.end() && it->second.end &&
         std::equal(prompt.begin(), prompt.end(), it->second.tokens.begin(), it->second.tokens.end());
}

std::vector<PrefixCache::Removed> PrefixCache::add(uint64_t key, Entry e) {
  std::vector<Removed> removed;
  // A collision: the newer prefix wins.
  if (auto it = entries_.find(key); it != entries_.end()) removed.push_back(erase(it));
  if (!make_room(e.bytes, e.end != nullptr, removed)) {
    removed.push_back(refused(e.tokens, e.snapshot, e.bytes - (e.end ? e.end->bytes() : 0), e.end, false));
    return removed;
  }
  e.last_used = ++clock_;
  bytes_ += e.bytes;
  if (e.end) end_bytes_ += e.bytes;
  entries_.emplace(key, std::move(e));
  return removed;
}

// Each kind (prompt ends; block-aligned snapshots) may take the least recently used entry of
// either kind while it holds at most half of the capacity, and only its own kind's past that: a
// stream of prompts never repeated cannot push out the snapshots of shared prefixes, nor the
// other way round.
bool PrefixCache::make_room(int64_t bytes, bool prompt_end, std::vector<Removed>& removed) {
  auto own = [&] { return prompt_end ? end_bytes_ : bytes_ - end_bytes_; };
  if (2 * bytes > capacity_ && bytes_ - own() + bytes > capacity_) return false;  // its own kind's room is not enough
  while (bytes_ + bytes > capacity_) {
    const bool own_only = 2 * (own() + bytes) > capacity_;
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if ((!own_only || (it->second.end != nullptr) == prompt_end) &&
          (victim == entries_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == entries_.end()) return false;
    removed.push_back(erase(victim));
  }
  return true;
}

PrefixCache::Removed PrefixCache::erase(EntryMap::iterator it) {
  Entry& e = it->second;
  bytes_ -= e.bytes;
  if (e.end) {
    end_bytes_ -= e.bytes;
    const int64_t len = int64_t(e.tokens.size()), rem = len - (len - 1) / block_size_ * block_size_;
    if (auto tails = end_tails_.find(e.blocks_hash); tails != end_tails_.end()) {
      std::vector<int32_t>& counts = tails->second;
      if (counts[size_t(rem)] > 0) --counts[size_t(rem)];
      if (std::all_of(counts.begin(), counts.end(), [](int32_t c) { return c == 0; })) end_tails_.erase(tails);
    }
  }
  Removed out{e.snapshot, e.bytes - (e.end ? e.end->bytes() : 0), std::move(e.tokens), std::move(e.end), false};
  entries_.erase(it);
  return out;
}

std::vector<PrefixCache::Removed> PrefixCache::clear() {
  std::vector<Removed> removed;
  while (!entries_.empty()) removed.push_back(erase(entries_.begin()));
  return removed;
}

PrefixCache::Removed PrefixCache::evict_lru() {
  if (entries_.empty()) return {};
  return erase(std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
    return a.second.last_used < b.second.last_used;
  }));
}

}  // namespace fathom
