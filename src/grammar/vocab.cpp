#include "grammar/vocab.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace fathom::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<uint8_t> special,
                       std::vector<uint32_t> stop_ids)
    : bytes_(std::move(token_bytes)), special_(std::move(special)), stop_ids_(std::move(stop_ids)) {
  special_.resize(bytes_.size(), 0);
  for (uint32_t id : stop_ids_) {
    FATHOM_CHECK(id < bytes_.size(), "grammar vocabulary: stop id ", id, " out of range");
    special_[id] = 1;
  }
  build_trie();
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const tok::Tokenizer& tok,
                                                             std::vector<uint32_t> stop_ids,
                                                             size_t padded_size) {
  size_t n = tok.vocab_size();
  std::vector<std::string> bytes(std::max(n, padded_size));
  std::vector<uint8_t> special(bytes.size(), 1);
  std::fill(special.begin(), special.begin() + n, 0);
  std::vector<uint8_t> added(n, 0);
  for (const auto& t : tok.added_tokens()) {
    if (t.id >= n) continue;
    added[t.id] = 1;
    special[t.id] = t.special;
    bytes[t.id] = t.content;
  }
  for (uint32_t id = 0; id < n; ++id) {
    if (added[id]) continue;
    auto s = tok.id_to_token(id);
    if (!s) {
      special[id] = 1;  // a hole in the id space
      continue;
    }
    if (!tok::byte_level_to_bytes(*s, bytes[id])) bytes[id] = tok.decode({id});
  }
  return std::make_shared<Vocabulary>(std::move(bytes), std::move(special), std::move(stop_ids));
}

void Vocabulary::build_trie() {
  for (uint32_t id = 0; id < bytes_.size(); ++id)
    if (!special_[id] && !bytes_[id].empty()) sorted_.push_back(id);
  std::sort(sorted_.begin(), sorted_.end(), [&](uint32_t a, uint32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  trie_.push_back({0, 0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // node index per depth along the current token
  auto close_to = [&](size_t depth, uint32_t at) {
    while (path.size() > depth + 1) {
      TrieNode& nd = trie_[path.back()];
      nd.subtree = static_cast<uint32_t>(trie_.size()) - path.back();
      nd.hi = at;
      path.pop_back();
    }
  };
  const std::string* prev = nullptr;
  for (uint32_t i = 0; i < sorted_.size(); ++i) {
    const std::string& s = bytes_[sorted_[i]];
    FATHOM_CHECK(s.size() < 65535, "grammar vocabulary: token ", sorted_[i], " too long");
    size_t lcp = 0;
    if (prev)
      while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
    close_to(lcp, i);
    for (size_t d = lcp + 1; d <= s.size(); ++d) {
      path.push_back(static_cast<uint32_t>(trie_.size()));
      trie_.push_back({0, i, 0, 0, static_cast<uint16_t>(d), static_cast<uint8_t>(s[d - 1])});
    }
    ++trie_[path.back()].n_end;
    prev = &s;
  }
  close_to(0, static_cast<uint32_t>(sorted_.size()));
  trie_[0].subtree = static_cast<uint32_t>(trie_.size());
  trie_[0].hi = static_cast<uint32_t>(sorted_.size());
  // Children lists: in preorder a node's children are k + 1, then each next one a subtree on.
  child_begin_.assign(trie_.size() + 1, 0);
  for (uint32_t k = 0; k < trie_.size(); ++k) {
    child_begin_[k] = static_cast<uint32_t>(child_node_.size());
    for (uint32_t c = k + 1, end = k + trie_[k].subtree; c < end; c += trie_[c].subtree) {
      child_node_.push_back(c);
      child_byte_.push_back(trie_[c].byte);
    }
  }
  child_begin_[trie_.size()] = static_cast<uint32_t>(child_node_.size());
}

}  // namespace fathom::grammar
