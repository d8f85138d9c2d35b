#include "grammar/regex.h"

#include <cctype>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace fathom::grammar {

uint32_t next_codepoint(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  FATHOM_CHECK(n && i + n <= s.size(), "grammar: invalid UTF-8 at byte ", i);
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    auto cc = static_cast<unsigned char>(s[i + k]);
    FATHOM_CHECK((cc & 0xC0) == 0x80, "grammar: invalid UTF-8 at byte ", i);
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += n;
  return cp;
}

namespace {

bool json_unsafe(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

std::string json_escape(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    case '\b': return "\\b";
    case '\f': return "\\f";
  }
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\u%04x", cp);
  return buf;
}

Expr literal_cp(uint32_t cp, bool json_string) {
  std::string s;
  if (json_string && json_unsafe(cp))
    s = json_escape(cp);
  else
    append_utf8(cp, s);
  return Expr::literal(s);
}

const Ranges kDigit{{'0', '9'}};
const Ranges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace{{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(std::string_view p, const RegexOptions& o) : p_(p), json_(o.json_string) {}

  Expr parse() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    Expr e = parse_alt();
    FATHOM_CHECK(i_ == p_.size(), "regex: unbalanced ')' at offset ", i_);
    return e;
  }

 private:
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }
  [[noreturn]] void error(const std::string& what) const { fail("regex: ", what, " at offset ", i_); }

  Expr parse_alt() {
    std::vector<Expr> alts{parse_seq()};
    while (at('|')) {
      ++i_;
      alts.push_back(parse_seq());
    }
    return Expr::alt(std::move(alts));
  }

  Expr parse_seq() {
    std::vector<Expr> items;
    while (i_ < p_.size() && !at('|') && !at(')')) {
      if (at('$') && i_ + 1 == p_.size()) {
        ++i_;
        break;
      }
      Expr atom = parse_atom();
      items.push_back(parse_quantifiers(std::move(atom)));
    }
    return items.size() == 1 ? std::move(items[0]) : Expr::seq(std::move(items));
  }

  Expr parse_quantifiers(Expr atom) {
    for (;;) {
      int min, max;
      if (at('*')) min = 0, max = -1, ++i_;
      else if (at('+')) min = 1, max = -1, ++i_;
      else if (at('?')) min = 0, max = 1, ++i_;
      else if (at('{') && parse_braces(min, max)) {}
      else return atom;
      if (at('?')) ++i_;  // lazy: same language
      atom = Expr::repeat(std::move(atom), min, max);
    }
  }

  int parse_int() {
    size_t start = i_;
    long v = 0;
    while (i_ < p_.size() && p_[i_] >= '0' && p_[i_] <= '9') {
      v = v * 10 + (p_[i_++] - '0');
      if (v > 100000) error("repetition count too large");
    }
    return i_ == start ? -1 : static_cast<int>(v);
  }

  bool parse_braces(int& min, int& max) {
    size_t save = i_++;
    min = parse_int();
    max = min;
    if (min >= 0 && at(',')) {
      ++i_;
      max = parse_int();
      if (max < 0) max = -1;
      else if (max < min) error("{m,n} with n < m");
    }
    if (min < 0 || !at('}')) {  // not a quantifier: '{' is a literal
      i_ = save;
      return false;
    }
    ++i_;
    return true;
  }

  Expr parse_atom() {
    char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (at('?')) {
        if (p_.substr(i_, 2) != "?:") error("unsupported group syntax (lookaround, named group or flags)");
        i_ += 2;
      }
      Expr e = parse_alt();
      if (!at(')')) error("missing ')'");
      ++i_;
      return e;
    }
    if (c == '[') return class_expr(parse_class(), json_);
    if (c == '.') {
      ++i_;
      return class_expr({{0, '\n' - 1}, {'\n' + 1, 0x10FFFF}}, json_);
    }
    if (c == '*' || c == '+' || c == '?') error("quantifier without operand");
    if (c == '^' || c == '$') error("anchors are only supported at the start and end");
    if (c == '\\') {
      Ranges r;
      uint32_t cp = parse_escape(r);
      return r.empty() ? literal_cp(cp, json_) : class_expr(r, json_);
    }
    return literal_cp(next_codepoint(p_, i_), json_);
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k, ++i_) {
      if (i_ >= p_.size() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) error("bad hex escape");
      char h = p_[i_];
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  // After '\': returns a code point, or fills `cls` for class escapes (\d \w \s and negations).
  uint32_t parse_escape(Ranges& cls) {
    ++i_;
    if (i_ >= p_.size()) error("trailing backslash");
    char c = p_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u':
        if (at('{')) {
          ++i_;
          size_t start = i_;
          while (i_ < p_.size() && p_[i_] != '}') ++i_;
          size_t n = i_ - start;
          i_ = start;
          uint32_t v = hex(n);
          ++i_;
          return v;
        }
        return hex(4);
      case 'd': cls = kDigit; return 0;
      case 'w': cls = kWord; return 0;
      case 's': cls = kSpace; return 0;
      case 'D': cls = complement_ranges(kDigit); return 0;
      case 'W': cls = complement_ranges(kWord); return 0;
      case 'S': cls = complement_ranges(kSpace); return 0;
    }
    if (std::isalnum(static_cast<unsigned char>(c)))
      error(std::string("unsupported escape \\") + c + " (backreferences, \\b and \\B are not supported)");
    --i_;
    return next_codepoint(p_, i_);
  }

  Ranges parse_class() {
    ++i_;  // '['
    bool negate = at('^');
    if (negate) ++i_;
    Ranges r;
    bool first = true;
    while (i_ < p_.size() && (!at(']') || first)) {
      first = false;
      uint32_t lo;
      if (at('\\')) {
        Ranges cls;
        lo = parse_escape(cls);
        if (!cls.empty()) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
      } else {
        lo = next_codepoint(p_, i_);
      }
      uint32_t hi = lo;
      if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        Ranges cls;
        hi = at('\\') ? parse_escape(cls) : next_codepoint(p_, i_);
        if (!cls.empty() || hi < lo) error("bad class range");
      }
      r.push_back({lo, hi});
    }
    if (!at(']')) error("missing ']'");
    ++i_;
    normalize_ranges(r);
    return negate ? complement_ranges(r) : r;
  }

  std::string_view p_;
  bool json_;
  size_t i_ = 0;
};

}  // namespace

Expr class_expr(const Ranges& ranges, bool json_string) {
  if (!json_string) return codepoint_class(ranges);
  // Safe code points go through as they are; '"', '\' and controls as their JSON escapes.
  Ranges safe;
  std::vector<Expr> escapes;
  for (auto [lo, hi] : ranges) {
    for (uint32_t cp = lo; cp <= std::min<uint32_t>(hi, 0x5C); ++cp)
      if (json_unsafe(cp)) escapes.push_back(Expr::literal(json_escape(cp)));
    uint32_t a = lo;
    while (a <= hi) {
      while (a <= hi && a <= 0x5C && json_unsafe(a)) ++a;
      if (a > hi) break;
      uint32_t b = a;
      if (a > 0x5C) b = hi;
      while (b < hi && !(b + 1 <= 0x5C && json_unsafe(b + 1))) ++b;
      safe.push_back({a, b});
      a = b + 1;
    }
  }
  std::vector<Expr> alts;
  if (!safe.empty()) alts.push_back(codepoint_class(safe));
  for (auto& e : escapes) alts.push_back(std::move(e));
  FATHOM_CHECK(!alts.empty(), "regex: empty character class");
  return Expr::alt(std::move(alts));
}

Expr regex_to_expr(std::string_view pattern, const RegexOptions& opts) { return RegexParser(pattern, opts).parse(); }

std::shared_ptr<const Grammar> grammar_from_regex(std::string_view pattern) {
  GrammarBuilder b;
  b.define(b.rule("root"), regex_to_expr(pattern));
  return Grammar::build(b, "root");
}

std::shared_ptr<const Grammar> grammar_from_choices(const std::vector<std::string>& choices) {
  FATHOM_CHECK(!choices.empty(), "grammar: choice list is empty");
  std::vector<Expr> alts;
  for (const auto& c : choices) alts.push_back(c.empty() ? Expr::empty() : Expr::literal(c));
  GrammarBuilder b;
  b.define(b.rule("root"), Expr::alt(std::move(alts)));
  return Grammar::build(b, "root");
}

}  // namespace fathom::grammar
