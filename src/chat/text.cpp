#include "chat/text.h"

#include <cwctype>

namespace fathom::chat {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
    else { out.push_back(0xfffd); ++i; continue; }
    if (i + n > s.size()) { out.push_back(0xfffd); break; }
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xc0) != 0x80) ++n;
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if (py_isspace(c)) return false;
  if ((c >= 0x200b && c <= 0x200f) || (c >= 0x202a && c <= 0x202e) || (c >= 0x2060 && c <= 0x206f)) return false;
  if (c == 0xfeff || (c >= 0xd800 && c <= 0xf8ff) || (c >= 0xfff9 && c <= 0xfffb)) return false;
  if (c >= 0xf0000) return false;
  if (c == 0x061c || c == 0x180e) return false;
  return true;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

static char32_t lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  return static_cast<char32_t>(std::towlower(static_cast<wint_t>(c)));
}
static char32_t upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  return static_cast<char32_t>(std::towupper(static_cast<wint_t>(c)));
}
static bool is_cased_letter(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c; }

std::string py_lower(std::string_view s) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = lower_cp(c);
  return utf8_encode(u);
}
std::string py_upper(std::string_view s) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = upper_cp(c);
  return utf8_encode(u);
}
std::string py_capitalize(std::string_view s) {
  std::u32string u = utf8_decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? upper_cp(u[i]) : lower_cp(u[i]);
  return utf8_encode(u);
}
std::string py_title(std::string_view s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (auto& c : u) {
    bool cased = is_cased_letter(c);
    if (cased) c = prev_cased ? lower_cp(c) : upper_cp(c);
    prev_cased = cased;
  }
  return utf8_encode(u);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, long long count) {
  std::string out;
  if (old.empty()) {
    // Python inserts rep between every code point (and at both ends).
    std::u32string u = utf8_decode(s);
    long long done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) { out += rep; ++done; }
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  long long done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += rep;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

}  // namespace fathom::chat
