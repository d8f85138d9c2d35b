// The token vocabulary as bytes, with a trie over it built once per vocabulary and shared by
// every grammar compiled against it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fathom::tok {
class Tokenizer;
}

namespace fathom::grammar {

class Vocabulary {
 public:
  // token_bytes[i]: the bytes token i stands for. special[i] != 0: a control token that the
  // grammar never produces (e.g. <|im_end|>). stop_ids: tokens allowed exactly when the grammar
  // is complete (EOS and other stop tokens).
  Vocabulary(std::vector<std::string> token_bytes, std::vector<uint8_t> special, std::vector<uint32_t> stop_ids);
  // Byte-level BPE tokens go through the GPT-2 byte alphabet; added non-special tokens are
  // their text; special tokens are excluded. padded_size: the model's (larger) logits width;
  // ids past the tokenizer's are never allowed.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const tok::Tokenizer& tok, std::vector<uint32_t> stop_ids,
                                                          size_t padded_size = 0);

  size_t size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(uint32_t id) const { return bytes_[id]; }
  const std::vector<uint32_t>& stop_ids() const { return stop_ids_; }
  // Never grammar text: special, stop, padding, or empty tokens.
  bool is_special(uint32_t id) const { return special_[id] || bytes_[id].empty(); }

  // Trie nodes in preorder: a node's subtree is [i, i + subtree). Root is node 0 (no byte).
  // Tokens under a node are sorted()[lo, hi); those ending at the node are [lo, lo + n_end).
  struct TrieNode {
    uint32_t subtree, lo, hi, n_end;
    uint16_t depth;
    uint8_t byte;
  };
  const std::vector<TrieNode>& trie() const { return trie_; }
  // The children of trie node k, in preorder: nodes child_node()[i] with bytes child_byte()[i],
  // i in [child_begin()[k], child_begin()[k + 1]) (contiguous: a walk tests the bytes without
  // reading the nodes, which lie a subtree apart).
  const std::vector<uint32_t>& child_begin() const { return child_begin_; }
  const std::vector<uint32_t>& child_node() const { return child_node_; }
  const std::vector<uint8_t>& child_byte() const { return child_byte_; }
  // Grammar tokens (not special, not empty) sorted by bytes.
  const std::vector<uint32_t>& sorted() const { return sorted_; }

 private:
  void build_trie();

  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_;
  std::vector<uint32_t> stop_ids_;
  std::vector<uint32_t> sorted_;
  std::vector<TrieNode> trie_;
  std::vector<uint32_t> child_begin_, child_node_;
  std::vector<uint8_t> child_byte_;
};

}  // namespace fathom::grammar
