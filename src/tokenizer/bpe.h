// The BPE model of tokenizer.json: vocab, merges (either "a b" strings or ["a","b"] pairs),
// ignore_merges, unk/byte_fallback, and a fast merge loop over a pair->rank hash map with a
// cache of word results.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fathom::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

// Open-addressing map from a symbol pair (a, b) to (rank, merged id).
class MergeMap {
 public:
  void reserve(size_t n);
  void insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id);  // later inserts overwrite
  // Returns false if (a, b) is not a merge.
  bool find(uint32_t a, uint32_t b, uint32_t& rank, uint32_t& id) const {
    uint64_t key = (uint64_t(a) << 32) | b;
    size_t i = slot(key);
    while (true) {
      const Entry& e = table_[i];
      if (e.key == key) {
        rank = e.rank;
        id = e.id;
        return true;
      }
      if (e.key == kEmpty) return false;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0, id = 0;
  };
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Entry> table_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

class BpeModel {
 public:
  // Builds the model from the "model" object of tokenizer.json; throws fathom::Error on bad input.
  explicit BpeModel(const nlohmann::json& model);
  ~BpeModel();

  // Tokenizes one pre-token given in the model's own alphabet (for byte-level models, already
  // mapped to the byte-level characters).
  void tokenize(std::string_view piece, std::vector<uint32_t>& out) const;
  // Tokenizes one pre-token given as raw bytes, for models fed by a ByteLevel pre-tokenizer:
  // equivalent to tokenize(bytes_to_byte_level(piece)) but without building that string.
  void tokenize_bytes(std::string_view piece, std::vector<uint32_t>& out) const;

  std::optional<uint32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(uint32_t id) const;
  // One past the largest id in the vocab.
  size_t vocab_size() const { return id_to_token_.size(); }
  size_t merges_size() const { return merges_.size(); }

 private:
  struct Cache;
  // Merges symbols in place (HF Word::merge_all without dropout).
  void merge(std::vector<uint32_t>& syms) const;
  void merge_long(std::vector<uint32_t>& syms) const;
  bool cache_get(std::string_view key, size_t hash, std::vector<uint32_t>& out) const;
  void cache_put(std::string_view key, size_t hash, const uint32_t* ids, size_t n) const;

  VocabMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  MergeMap merges_;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  std::optional<uint32_t> unk_id_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  // Raw-byte fast path (when every byte-level character is in the vocab and there is no
  // prefix/suffix): byte -> id, and raw-bytes -> id for ignore_merges.
  bool byte_fast_ = false;
  std::array<uint32_t, 256> byte_id_{};
  VocabMap byte_vocab_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace fathom::tok
