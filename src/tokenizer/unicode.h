// UTF-8 helpers and the few Unicode properties the tokenizer needs (via utf8proc).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace fathom::tok {

// Decodes one code point at s[i] (s must be valid UTF-8); returns it and advances i.
char32_t utf8_next(std::string_view s, size_t& i);
// Appends the UTF-8 encoding of cp.
void utf8_append(std::string& out, char32_t cp);
// Length of the longest valid UTF-8 prefix of s.
size_t utf8_valid_prefix(std::string_view s);
inline bool utf8_valid(std::string_view s) { return utf8_valid_prefix(s) == s.size(); }
// Like Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Rust char::is_whitespace (the White_Space property).
bool is_white_space(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// A regex \w character: letters, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t c);

}  // namespace fathom::tok
