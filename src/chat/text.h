// UTF-8 and Python str helpers for the chat-template interpreter: code point access and the
// whitespace / case rules that Python's str methods use.
#pragma once
#include <string>
#include <string_view>

namespace fathom::chat {

std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t cp);
size_t utf8_length(std::string_view s);

bool py_isspace(char32_t c);
bool py_isprintable(char32_t c);
// str.strip / lstrip / rstrip; chars == nullptr means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, long long count);

}  // namespace fathom::chat
