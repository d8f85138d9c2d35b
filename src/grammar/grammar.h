// A context-free grammar over bytes, the common target of every front-end (GBNF, regex, choices,
// JSON Schema). Front-ends build an Expr tree per named rule; Grammar::build flattens it into
// rules whose alternatives are sequences of byte sets and rule references, which the stack
// matcher (stack_pool.h) runs as a pushdown automaton. Left recursion is rejected at build time.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fathom::grammar {

// A set of bytes (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool test(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void set(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void set_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) set(static_cast<uint8_t>(b));
  }
  bool empty() const { return !(w[0] | w[1] | w[2] | w[3]); }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.set(b);
    return s;
  }
};

// Expression tree of the front-ends. Repeat max < 0 means unbounded.
struct Expr {
  enum class Kind { Bytes, Seq, Alt, Repeat, Ref };
  Kind kind = Kind::Seq;
  ByteSet bytes;            // Bytes
  std::vector<Expr> kids;   // Seq, Alt, Repeat (one kid)
  int min = 0, max = 0;     // Repeat
  uint32_t rule = 0;        // Ref

  static Expr empty() { return Expr{}; }
  static Expr byte_set(const ByteSet& s);
  static Expr literal(std::string_view bytes);
  static Expr seq(std::vector<Expr> kids);
  static Expr alt(std::vector<Expr> kids);
  static Expr repeat(Expr kid, int min, int max);
  static Expr ref(uint32_t rule);
};

// Appends the UTF-8 byte sequences of the code points [lo, hi] as alternatives to `out`.
void utf8_range_alts(uint32_t lo, uint32_t hi, std::vector<Expr>& out);
// An Expr matching one UTF-8 encoded code point from the sorted, disjoint ranges.
Expr codepoint_class(const std::vector<std::pair<uint32_t, uint32_t>>& ranges);
// Complement of sorted, disjoint ranges within [0, 0x10FFFF], surrogates excluded.
std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges);
// Sorts and merges overlapping or adjacent ranges.
void normalize_ranges(std::vector<std::pair<uint32_t, uint32_t>>& ranges);
void append_utf8(uint32_t cp, std::string& out);

// Named rules under construction; a rule may be referenced before it is defined.
class GrammarBuilder {
 public:
  // Returns the id of rule `name`, declaring it if new.
  uint32_t rule(const std::string& name);
  bool has_rule(const std::string& name) const;
  void define(uint32_t rule, Expr body);
  bool defined(uint32_t rule) const { return defined_[rule]; }
  const std::string& name(uint32_t rule) const { return names_[rule]; }
  size_t size() const { return names_.size(); }
  const Expr& body(uint32_t rule) const { return bodies_[rule]; }

 private:
  std::vector<std::string> names_;
  std::vector<Expr> bodies_;
  std::vector<bool> defined_;
  std::unordered_map<std::string, uint32_t> index_;  // name -> id (schemas make thousands of rules)
};

// The flattened grammar. Element kinds: a byte set to match, a reference to a rule, or the end
// of an alternative. Each alternative is a run of elements closed by End.
class Grammar {
 public:
  enum class Kind : uint8_t { Bytes, Ref, End };
  struct Elem {
    Kind kind;
    uint32_t arg;  // Bytes: index into sets(); Ref: rule id
  };

  // Flattens the builder's rules; throws fathom::Error for undefined rules, left recursion,
  // rules that match nothing, or a grammar too large.
  static std::shared_ptr<const Grammar> build(const GrammarBuilder& b, const std::string& root);

  uint32_t root() const { return root_; }
  const std::vector<Elem>& elems() const { return elems_; }
  const std::vector<ByteSet>& sets() const { return sets_; }
  const std::vector<uint32_t>& alts(uint32_t rule) const { return rule_alts_[rule]; }
  size_t num_rules() const { return rule_alts_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  // Fewest bytes that complete the alternative from element `pos` on (to its End).
  uint32_t min_suffix_len(uint32_t pos) const { return min_suffix_[pos]; }
  // A shortest byte string completing the alternative from `pos` (for closing a generation).
  std::string shortest_suffix(uint32_t pos) const;
  // Debug text in GBNF-like form.
  std::string to_string() const;

 private:
  friend class Flattener;
  void check_left_recursion() const;
  void compute_min_lengths();

  std::vector<Elem> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<uint32_t>> rule_alts_;  // start element of each alternative
  std::vector<std::string> names_;
  std::vector<uint32_t> min_rule_;    // fewest bytes a rule derives
  std::vector<uint32_t> min_suffix_;  // per element
  std::vector<uint32_t> best_alt_;    // per rule: the alternative giving min_rule_
  uint32_t root_ = 0;
};

}  // namespace fathom::grammar
