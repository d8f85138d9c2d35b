// GPT-2 byte-level alphabet: each byte maps to one printable code point (and back).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace fathom::tok {

struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_char;
  std::array<std::string, 256> byte_to_utf8;
  // Returns true and writes the byte if cp is in the alphabet.
  bool char_to_byte(char32_t cp, uint8_t& byte) const {
    if (cp < 0x144 && char_valid[cp]) {
      byte = char_byte[cp];
      return true;
    }
    return false;
  }
  std::array<bool, 0x144> char_valid{};
  std::array<uint8_t, 0x144> char_byte{};

  static const ByteLevelAlphabet& get();
};

// Maps raw bytes to their byte-level string (what HF's ByteLevel pre-tokenizer produces).
std::string bytes_to_byte_level(std::string_view bytes);
// Maps a byte-level token back to raw bytes; false if some char is outside the alphabet.
bool byte_level_to_bytes(std::string_view token, std::string& out);

}  // namespace fathom::tok
