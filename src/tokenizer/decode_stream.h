// Incremental detokenization for streaming, like HF tokenizers.decoders.DecodeStream: feed ids one
// at a time; each step returns only newly completed text (never a partial UTF-8 character).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fathom::tok {

class Tokenizer;

class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tok, bool skip_special_tokens = false)
      : tok_(&tok), skip_special_(skip_special_tokens) {}
  // Returns the new text made complete by `id`, or nullopt when nothing is complete yet.
  std::optional<std::string> step(uint32_t id);

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<uint32_t> ids_;
  std::string prefix_;
  size_t prefix_index_ = 0;
};

}  // namespace fathom::tok
