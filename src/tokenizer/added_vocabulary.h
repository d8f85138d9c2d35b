// Added tokens (tokenizer.json "added_tokens"): split the text on them before normalization and
// pre-tokenization, like HF's AddedVocabulary (leftmost-longest matching; lstrip, rstrip,
// single_word; normalized tokens matched on the normalized text).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fathom::tok {

class Normalizer;

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// One piece of split text: [start, end) of the input, and the token id if it is an added token.
struct Segment {
  size_t start, end;
  int64_t id;  // -1: plain text
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // Parses the "added_tokens" array; normalized tokens are matched in normalized form.
  void load(const nlohmann::json& added_tokens, const Normalizer* normalizer);

  // Splits text on the non-normalized (normalized=false) or normalized tokens; appends segments.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;
  bool has_normalized() const { return !normalized_trie_.nodes.empty() && normalized_trie_.count > 0; }

  const AddedToken* by_id(uint32_t id) const;
  std::optional<uint32_t> token_to_id(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool is_special(uint32_t id) const {
    auto* t = by_id(id);
    return t && t->special;
  }

 private:
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
      int token = -1;                                   // index into tokens_
    };
    std::vector<Node> nodes;
    bool first[256] = {};
    int count = 0;
    void add(std::string_view key, int token);
    // Longest token starting at text[i]: returns its length (0 if none) and token index.
    size_t longest(std::string_view text, size_t i, int& token) const;
  };
  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, size_t> by_id_;
  std::unordered_map<std::string, uint32_t> by_content_;
  Trie trie_, normalized_trie_;
};

}  // namespace fathom::tok
