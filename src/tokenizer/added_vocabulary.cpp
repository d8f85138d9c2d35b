#include "tokenizer/added_vocabulary.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

void AddedVocabulary::Trie::add(std::string_view key, int token) {
  if (key.empty()) return;
  if (nodes.empty()) nodes.emplace_back();
  int cur = 0;
  for (unsigned char c : key) {
    auto& nx = nodes[cur].next;
    auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(c, -1));
    if (it != nx.end() && it->first == c) {
      cur = it->second;
    } else {
      int id = static_cast<int>(nodes.size());
      nx.insert(it, {c, id});
      nodes.emplace_back();
      cur = id;
    }
  }
  if (nodes[cur].token < 0) ++count;
  // HF: a later token with the same content replaces the earlier one's pattern id.
  nodes[cur].token = token;
  first[static_cast<unsigned char>(key[0])] = true;
}

size_t AddedVocabulary::Trie::longest(std::string_view text, size_t i, int& token) const {
  size_t best = 0;
  int cur = 0;
  for (size_t k = i; k < text.size(); ++k) {
    const auto& nx = nodes[cur].next;
    unsigned char c = static_cast<unsigned char>(text[k]);
    auto it = std::lower_bound(nx.begin(), nx.end(), std::make_pair(c, -1));
    if (it == nx.end() || it->first != c) break;
    cur = it->second;
    if (nodes[cur].token >= 0) {
      best = k + 1 - i;
      token = nodes[cur].token;
    }
  }
  return best;
}

void AddedVocabulary::load(const nlohmann::json& j, const Normalizer* normalizer) {
  if (j.is_null()) return;
  for (const auto& t : j) {
    AddedToken a;
    a.id = t.at("id").get<uint32_t>();
    a.content = t.at("content").get<std::string>();
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);
    by_id_[a.id] = tokens_.size();
    by_content_[a.content] = a.id;
    tokens_.push_back(std::move(a));
  }
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const auto& a = tokens_[k];
    if (a.normalized) {
      std::string c = a.content;
      if (normalizer) normalizer->normalize(c);
      normalized_trie_.add(c, static_cast<int>(k));
    } else {
      trie_.add(a.content, static_cast<int>(k));
    }
  }
}

const AddedToken* AddedVocabulary::by_id(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<uint32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

static bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return is_word_char(utf8_next(s, i));
}
static bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return is_word_char(utf8_next(s, i));
}

void AddedVocabulary::split(std::string_view text, bool normalized, std::vector<Segment>& out) const {
  const Trie& trie = normalized ? normalized_trie_ : trie_;
  if (trie.count == 0 || text.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!trie.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int tok = -1;
    size_t len = trie.longest(text, i, tok);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // the matcher continues after this match whether or not it is used
    const AddedToken& a = tokens_[tok];
    if (a.single_word) {
      bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      bool stop_space = stop == n || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (a.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t p = ns - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_white_space(utf8_next(text, q))) break;
        ns = p;
      }
      start = std::max(ns, start_offset);
    }
    if (a.rstrip) {
      size_t q = stop;
      while (q < n) {
        size_t r = q;
        if (!is_white_space(utf8_next(text, r))) break;
        q = r;
      }
      stop = q;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, static_cast<int64_t>(a.id)});
    start_offset = stop;
  }
  if (start_offset != n) out.push_back({start_offset, n, -1});
}

}  // namespace fathom::tok
