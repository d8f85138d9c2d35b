#include "grammar/gbnf.h"

#include <cctype>

#include "core/error.h"
#include "grammar/regex.h"

namespace fathom::grammar {

namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

class GbnfParser {
 public:
  GbnfParser(std::string_view t, GrammarBuilder& b) : t_(t), b_(b) {}

  void parse() {
    skip_space();
    while (i_ < t_.size()) {
      std::string name = parse_name();
      skip_space();
      if (t_.substr(i_, 3) != "::=") error("expected '::='");
      i_ += 3;
      uint32_t id = b_.rule(name);
      if (b_.defined(id)) error("rule '" + name + "' defined twice");
      b_.define(id, parse_alt(0));
      skip_space();
    }
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    size_t line = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) line += t_[k] == '\n';
    fail("gbnf: line ", line, ": ", what);
  }
  bool at(char c) const { return i_ < t_.size() && t_[i_] == c; }

  void skip_space() {
    while (i_ < t_.size()) {
      if (std::isspace(static_cast<unsigned char>(t_[i_]))) {
        ++i_;
      } else if (t_[i_] == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    size_t start = i_;
    while (i_ < t_.size() && name_char(t_[i_])) ++i_;
    if (i_ == start) error("expected a rule name");
    return std::string(t_.substr(start, i_ - start));
  }

  // Whether a `name ::=` (the next rule) starts at the current position.
  bool at_rule_start() const {
    size_t k = i_;
    while (k < t_.size() && name_char(t_[k])) ++k;
    if (k == i_) return false;
    while (k < t_.size() && (t_[k] == ' ' || t_[k] == '\t' || t_[k] == '\n' || t_[k] == '\r')) ++k;
    return t_.substr(k, 3) == "::=";
  }

  Expr parse_alt(int depth) {
    std::vector<Expr> alts{parse_seq(depth)};
    while (at('|')) {
      ++i_;
      alts.push_back(parse_seq(depth));
    }
    return Expr::alt(std::move(alts));
  }

  Expr parse_seq(int depth) {
    std::vector<Expr> items;
    for (;;) {
      skip_space();
      if (i_ >= t_.size() || at('|') || at(')')) break;
      if (depth == 0 && at_rule_start()) break;
      Expr e = parse_term(depth);
      items.push_back(parse_postfix(std::move(e)));
    }
    return items.size() == 1 ? std::move(items[0]) : Expr::seq(std::move(items));
  }

  int parse_int() {
    size_t start = i_;
    long v = 0;
    while (i_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[i_]))) {
      v = v * 10 + (t_[i_++] - '0');
      if (v > 100000) error("repetition count too large");
    }
    return i_ == start ? -1 : static_cast<int>(v);
  }

  Expr parse_postfix(Expr e) {
    for (;;) {
      if (at('*')) ++i_, e = Expr::repeat(std::move(e), 0, -1);
      else if (at('+')) ++i_, e = Expr::repeat(std::move(e), 1, -1);
      else if (at('?')) ++i_, e = Expr::repeat(std::move(e), 0, 1);
      else if (at('{')) {
        ++i_;
        skip_space();
        int min = parse_int(), max = min;
        skip_space();
        if (min < 0) error("expected a count after '{'");
        if (at(',')) {
          ++i_;
          skip_space();
          max = parse_int();
          skip_space();
          if (max >= 0 && max < min) error("{m,n} with n < m");
        }
        if (!at('}')) error("expected '}'");
        ++i_;
        e = Expr::repeat(std::move(e), min, max);
      } else {
        return e;
      }
    }
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t k = 0; k < n; ++k, ++i_) {
      if (i_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[i_]))) error("bad hex escape");
      char h = t_[i_];
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  uint32_t parse_char() {
    if (i_ >= t_.size()) error("unexpected end");
    if (!at('\\')) return next_codepoint(t_, i_);
    ++i_;
    if (i_ >= t_.size()) error("trailing backslash");
    char c = t_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return static_cast<uint8_t>(c);
    }
    error(std::string("unknown escape \\") + c);
  }

  Expr parse_term(int depth) {
    if (at('"')) {
      ++i_;
      std::string lit;
      while (!at('"')) append_utf8(parse_char(), lit);
      ++i_;
      return lit.empty() ? Expr::empty() : Expr::literal(lit);
    }
    if (at('[')) {
      ++i_;
      bool negate = at('^');
      if (negate) ++i_;
      Ranges r;
      while (!at(']')) {
        uint32_t lo = parse_char(), hi = lo;
        if (at('-') && i_ + 1 < t_.size() && t_[i_ + 1] != ']') {
          ++i_;
          hi = parse_char();
          if (hi < lo) error("bad class range");
        }
        r.push_back({lo, hi});
      }
      ++i_;
      normalize_ranges(r);
      return codepoint_class(negate ? complement_ranges(r) : r);
    }
    if (at('.')) {
      ++i_;
      return codepoint_class({{0, 0x10FFFF}});
    }
    if (at('(')) {
      ++i_;
      Expr e = parse_alt(depth + 1);
      skip_space();
      if (!at(')')) error("expected ')'");
      ++i_;
      return e;
    }
    if (i_ < t_.size() && name_char(t_[i_])) return Expr::ref(b_.rule(parse_name()));
    error(std::string("unexpected '") + t_[i_] + "'");
  }

  std::string_view t_;
  GrammarBuilder& b_;
  size_t i_ = 0;
};

}  // namespace

void parse_gbnf(std::string_view text, GrammarBuilder& b) { GbnfParser(text, b).parse(); }

std::shared_ptr<const Grammar> grammar_from_gbnf(std::string_view text, const std::string& root) {
  GrammarBuilder b;
  parse_gbnf(text, b);
  return Grammar::build(b, root);
}

}  // namespace fathom::grammar
