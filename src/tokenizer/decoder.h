// Decoders from tokenizer.json: ByteLevel (and a Sequence of them); null joins tokens with " ".
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace fathom::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // HF decode_chain: transforms the list of token strings.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Maps each token's byte-level characters back to bytes (a token with a character outside the
// alphabet keeps its UTF-8 bytes), concatenates, and replaces invalid UTF-8 with U+FFFD.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> d) : items_(std::move(d)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : items_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> items_;
};

// null gives nullptr; unsupported types throw fathom::Error.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

}  // namespace fathom::tok
