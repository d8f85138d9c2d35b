#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

void ByteLevelDecoder::decode_chain(std::vector<std::string>& tokens) const {
  std::string bytes;
  for (const auto& t : tokens)
    if (!byte_level_to_bytes(t, bytes)) bytes += t;
  tokens.assign(1, utf8_lossy(bytes));
}

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> items;
    for (const auto& d : j.at("decoders")) {
      auto p = make_decoder(d);
      if (p) items.push_back(std::move(p));
    }
    return std::make_unique<SequenceDecoder>(std::move(items));
  }
  fail("unsupported decoder type '", type, "' in tokenizer.json");
}

}  // namespace fathom::tok
