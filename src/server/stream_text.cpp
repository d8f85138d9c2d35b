#include "server/stream_text.h"

#include <algorithm>

namespace fathom::server {

size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k)
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

size_t incomplete_utf8_tail(std::string_view text) {
  // Walk back over at most 3 continuation bytes to the lead byte.
  size_t n = text.size(), k = 0;
  while (k < 3 && k < n && (static_cast<unsigned char>(text[n - 1 - k]) & 0xC0) == 0x80) ++k;
  if (k == n) return 0;
  const unsigned char lead = static_cast<unsigned char>(text[n - 1 - k]);
  size_t need = 0;
  if ((lead & 0xE0) == 0xC0) need = 2;
  else if ((lead & 0xF0) == 0xE0) need = 3;
  else if ((lead & 0xF8) == 0xF0) need = 4;
  return (need > k + 1) ? k + 1 : 0;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void append_json_escaped(std::string& out, std::string_view raw) {
  static const char* kHex = "0123456789abcdef";
  for (char ch : raw) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
        } else {
          out += ch;
        }
    }
  }
}

}  // namespace fathom::server
