#include "chat/lexer.h"

#include <algorithm>
#include <cstring>

#include "chat/text.h"
#include "core/error.h"

namespace fathom::chat {

SourceMap::SourceMap(const std::string& src) : src_(&src) {
  line_starts_.push_back(0);
  for (size_t k = 0; k < src.size(); ++k)
    if (src[k] == '\n') line_starts_.push_back(k + 1);
}

std::pair<int, int> SourceMap::position(size_t offset) const {
  auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
  size_t line = static_cast<size_t>(it - line_starts_.begin());
  size_t start = line_starts_[line - 1];
  size_t col = utf8_length(std::string_view(*src_).substr(start, offset - start)) + 1;
  return {static_cast<int>(line), static_cast<int>(col)};
}

std::string normalize_template_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out.push_back('\n');
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out.push_back(source[k]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

// Python's \s for the ASCII + common Unicode range, on UTF-8 bytes at pos; returns byte length or 0.
size_t space_at(const std::string& s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  std::u32string u = utf8_decode(std::string_view(s).substr(pos, n));
  return (!u.empty() && py_isspace(u[0])) ? n : 0;
}

size_t skip_spaces(const std::string& s, size_t pos) {
  while (size_t n = space_at(s, pos)) pos += n;
  return pos;
}

bool all_space(const std::string& s, size_t from) {
  return skip_spaces(s, from) == s.size();
}

std::string rstrip_ws(const std::string& s) { return py_strip(s, nullptr, false, true); }

class Lexer {
 public:
  Lexer(const std::string& src, const SourceMap& map) : src_(src), map_(map) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t k = pos;
      while (true) {
        k = src_.find('{', k);
        if (k == std::string::npos || k + 1 >= n) { k = std::string::npos; break; }
        char c = src_[k + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++k;
      }
      if (k == std::string::npos) {
        data(src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, k - pos);
      char kind = src_[k + 1];
      char sign = (k + 2 < n && (src_[k + 2] == '-' || src_[k + 2] == '+')) ? src_[k + 2] : 0;
      size_t body = k + 2 + (sign ? 1 : 0);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(text, l_pos)) text.resize(l_pos);
      }
      data(text, pos);
      if (kind == '#') {
        size_t e = src_.find("#}", body);
        if (e == std::string::npos) fail_at(k, "missing end of comment tag");
        size_t after = e + 2;
        if (e > body && src_[e - 1] == '-') after = skip_spaces(src_, after);
        else if (!(e > body && src_[e - 1] == '+') && after < n && src_[after] == '\n') ++after;
        line_starting = after > 0 && src_[after - 1] == '\n';
        pos = after;
        continue;
      }
      if (kind == '%') {
        size_t raw_end;
        if (is_raw(body, raw_end)) {
          pos = lex_raw(k, raw_end, line_starting);
          continue;
        }
      }
      pos = lex_tag(k, kind, body, line_starting);
    }
    Token eof{TokType::Eof, "", 0, 0, n};
    toks_.push_back(eof);
    return std::move(toks_);
  }

 private:
  const std::string& src_;
  const SourceMap& map_;
  std::vector<Token> toks_;

  [[noreturn]] void fail_at(size_t offset, const std::string& msg) {
    auto [line, col] = map_.position(offset);
    fail("chat template syntax error at line ", line, ":", col, ": ", msg);
  }

  void data(const std::string& text, size_t offset) {
    if (!text.empty()) toks_.push_back(Token{TokType::Data, text, 0, 0, offset});
  }

  bool word_at(size_t pos, const char* w) const { return src_.compare(pos, std::strlen(w), w) == 0; }

  // {% raw %} with optional sign already consumed: body points after "{%" and sign.
  bool is_raw(size_t body, size_t& end) {
    size_t p = skip_spaces(src_, body);
    if (!word_at(p, "raw")) return false;
    p += 3;
    if (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) return false;
    p = skip_spaces(src_, p);
    if (word_at(p, "-%}")) { end = skip_spaces(src_, p + 3); return true; }
    if (word_at(p, "%}")) { end = p + 2; return true; }
    return false;
  }

  size_t lex_raw(size_t start, size_t content, bool& line_starting) {
    size_t search = content;
    while (true) {
      size_t k = src_.find("{%", search);
      if (k == std::string::npos) fail_at(start, "missing end of raw directive");
      char sign = (k + 2 < src_.size() && (src_[k + 2] == '-' || src_[k + 2] == '+')) ? src_[k + 2] : 0;
      size_t p = skip_spaces(src_, k + 2 + (sign ? 1 : 0));
      if (word_at(p, "endraw")) {
        p = skip_spaces(src_, p + 6);
        size_t after;
        if (word_at(p, "+%}")) after = p + 3;
        else if (word_at(p, "-%}")) after = skip_spaces(src_, p + 3);
        else if (word_at(p, "%}")) {
          after = p + 2;
          if (after < src_.size() && src_[after] == '\n') ++after;
        } else {
          search = k + 2;
          continue;
        }
        std::string text = src_.substr(content, k - content);
        if (sign == '-') text = rstrip_ws(text);
        data(text, content);
        line_starting = src_[after - 1] == '\n';
        return after;
      }
      search = k + 2;
    }
  }

  size_t lex_tag(size_t start, char kind, size_t pos, bool& line_starting) {
    const bool block = kind == '%';
    toks_.push_back(Token{block ? TokType::BlockBegin : TokType::VarBegin, "", 0, 0, start});
    std::vector<char> balance;
    const size_t n = src_.size();
    while (true) {
      if (pos >= n) fail_at(start, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (balance.empty()) {
        size_t after = 0;
        bool end = false;
        if (block) {
          if (word_at(pos, "+%}")) { after = pos + 3; end = true; }
          else if (word_at(pos, "-%}")) { after = skip_spaces(src_, pos + 3); end = true; }
          else if (word_at(pos, "%}")) {
            after = pos + 2;
            if (after < n && src_[after] == '\n') ++after;
            end = true;
          }
        } else {
          if (word_at(pos, "-}}")) { after = skip_spaces(src_, pos + 3); end = true; }
          else if (word_at(pos, "}}")) { after = pos + 2; end = true; }
        }
        if (end) {
          toks_.push_back(Token{block ? TokType::BlockEnd : TokType::VarEnd, "", 0, 0, pos});
          line_starting = src_[after - 1] == '\n';
          return after;
        }
      }
      if (size_t sp = space_at(src_, pos)) { pos += sp; continue; }
      unsigned char c = static_cast<unsigned char>(src_[pos]);
      if (std::isdigit(c)) { pos = lex_number(pos); continue; }
      if (std::isalpha(c) || c == '_') {
        size_t e = pos;
        while (e < n && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        toks_.push_back(Token{TokType::Name, src_.substr(pos, e - pos), 0, 0, pos});
        pos = e;
        continue;
      }
      if (c == '\'' || c == '"') { pos = lex_string(pos); continue; }
      static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
      bool matched = false;
      for (const char* op : ops) {
        if (word_at(pos, op)) {
          std::string o = op;
          if (o == "(" || o == "[" || o == "{") balance.push_back(o[0]);
          else if (o == ")" || o == "]" || o == "}") {
            char want = o == ")" ? '(' : o == "]" ? '[' : '{';
            if (balance.empty() || balance.back() != want) fail_at(pos, "unexpected '" + o + "'");
            balance.pop_back();
          }
          toks_.push_back(Token{TokType::Op, o, 0, 0, pos});
          pos += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) fail_at(pos, std::string("unexpected char '") + src_[pos] + "'");
    }
  }

  size_t digits(size_t pos) const {  // (\d+_)*\d+
    size_t p = pos;
    while (true) {
      size_t q = p;
      while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
      if (q == p) return p == pos ? pos : p - 1;  // drop a dangling '_'
      p = q;
      if (p < src_.size() && src_[p] == '_' && p + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
        ++p;
        continue;
      }
      return p;
    }
  }

  size_t lex_number(size_t pos) {
    size_t e = digits(pos);
    bool is_float = false;
    bool after_dot = pos > 0 && src_[pos - 1] == '.';
    if (!after_dot) {
      size_t p = e;
      if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit(static_cast<unsigned char>(src_[p + 1]))) {
        p = digits(p + 1);
        is_float = true;
        e = p;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t q = p + 1;
        if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
        if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
          e = digits(q);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t k = pos; k < e; ++k)
      if (src_[k] != '_') text.push_back(src_[k]);
    Token t{is_float ? TokType::Float : TokType::Integer, text, 0, 0, pos};
    if (is_float) t.fval = std::stod(text);
    else {
      try {
        t.ival = std::stoll(text);
      } catch (...) {
        fail_at(pos, "integer literal out of range");
      }
    }
    toks_.push_back(t);
    return e;
  }

  size_t lex_string(size_t pos) {
    char q = src_[pos];
    size_t p = pos + 1;
    std::string raw;
    while (true) {
      if (p >= src_.size()) fail_at(pos, "unterminated string");
      char c = src_[p];
      if (c == '\\' && p + 1 < src_.size()) {
        raw.push_back(c);
        raw.push_back(src_[p + 1]);
        p += 2;
        continue;
      }
      if (c == q) break;
      raw.push_back(c);
      ++p;
    }
    toks_.push_back(Token{TokType::String, unescape(raw), 0, 0, pos});
    return p + 1;
  }

  // Python "unicode-escape" decoding of a literal body.
  static std::string unescape(const std::string& s) {
    std::string out;
    for (size_t k = 0; k < s.size(); ++k) {
      char c = s[k];
      if (c != '\\' || k + 1 >= s.size()) {
        out.push_back(c);
        continue;
      }
      char e = s[++k];
      auto hex = [&](int count) -> bool {
        char32_t v = 0;
        for (int d = 1; d <= count; ++d) {
          if (k + d >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[k + d]))) return false;
          char h = s[k + d];
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        utf8_append(out, v);
        k += count;
        return true;
      };
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '\n': break;
        case 'x': if (!hex(2)) { out += "\\x"; } break;
        case 'u': if (!hex(4)) { out += "\\u"; } break;
        case 'U': if (!hex(8)) { out += "\\U"; } break;
        default:
          if (e >= '0' && e <= '7') {
            int v = e - '0', cnt = 1;
            while (cnt < 3 && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '7') v = v * 8 + (s[++k] - '0'), ++cnt;
            utf8_append(out, static_cast<char32_t>(v));
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& src, const SourceMap& map) { return Lexer(src, map).run(); }

}  // namespace fathom::chat
