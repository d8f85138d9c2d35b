#include "tokenizer/byte_level.h"

#include "tokenizer/unicode.h"

namespace fathom::tok {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet a = [] {
    ByteLevelAlphabet t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      t.byte_to_char[b] = cp;
      utf8_append(t.byte_to_utf8[b], cp);
      t.char_valid[cp] = true;
      t.char_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return a;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& a = ByteLevelAlphabet::get();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += a.byte_to_utf8[b];
  return out;
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  const auto& a = ByteLevelAlphabet::get();
  size_t i = 0;
  size_t start = out.size();
  while (i < token.size()) {
    char32_t cp = utf8_next(token, i);
    uint8_t b;
    if (!a.char_to_byte(cp, b)) {
      out.resize(start);
      return false;
    }
    out.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace fathom::tok
