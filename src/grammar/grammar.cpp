#include "grammar/grammar.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

#include "core/error.h"

namespace fathom::grammar {

namespace {
constexpr uint32_t kInf = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxElems = size_t{1} << 22;

ByteSet range_set(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.set_range(lo, hi);
  return s;
}

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, uint8_t* out) {
  std::string s;
  append_utf8(cp, s);
  for (size_t i = 0; i < s.size() && i < 4; ++i) out[i] = static_cast<uint8_t>(s[i]);
}

// Splits [lo, hi] (same encoded length, no surrogates) until each piece is a product of byte ranges.
void split_range(uint32_t lo, uint32_t hi, std::vector<Expr>& out) {
  static constexpr uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t b : kBounds) {
    if (lo <= b && hi > b) {
      split_range(lo, b, out);
      split_range(b + 1, hi, out);
      return;
    }
  }
  int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_range(lo, lo | m, out);
        split_range((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_range(lo, (hi & ~m) - 1, out);
        split_range(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<Expr> seq;
  for (int i = 0; i < n; ++i) seq.push_back(Expr::byte_set(range_set(a[i], b[i])));
  out.push_back(n == 1 ? seq[0] : Expr::seq(std::move(seq)));
}
}  // namespace

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

Expr Expr::byte_set(const ByteSet& s) {
  Expr e;
  e.kind = Kind::Bytes;
  e.bytes = s;
  return e;
}
Expr Expr::literal(std::string_view bytes) {
  std::vector<Expr> kids;
  for (unsigned char c : bytes) kids.push_back(byte_set(ByteSet::of(c)));
  return kids.size() == 1 ? kids[0] : seq(std::move(kids));
}
Expr Expr::seq(std::vector<Expr> kids) {
  Expr e;
  e.kind = Kind::Seq;
  e.kids = std::move(kids);
  return e;
}
Expr Expr::alt(std::vector<Expr> kids) {
  if (kids.size() == 1) return std::move(kids[0]);
  Expr e;
  e.kind = Kind::Alt;
  e.kids = std::move(kids);
  return e;
}
Expr Expr::repeat(Expr kid, int min, int max) {
  Expr e;
  e.kind = Kind::Repeat;
  e.kids.push_back(std::move(kid));
  e.min = min;
  e.max = max;
  return e;
}
Expr Expr::ref(uint32_t rule) {
  Expr e;
  e.kind = Kind::Ref;
  e.rule = rule;
  return e;
}

void normalize_ranges(std::vector<std::pair<uint32_t, uint32_t>>& r) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto& p : r) {
    if (!out.empty() && p.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, p.second);
    else
      out.push_back(p);
  }
  r = std::move(out);
}

std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  ranges.push_back({0xD800, 0xDFFF});
  normalize_ranges(ranges);
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (auto& [lo, hi] : ranges) {
    if (lo > next) out.push_back({next, lo - 1});
    next = std::max(next, hi + 1);
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

void utf8_range_alts(uint32_t lo, uint32_t hi, std::vector<Expr>& out) {
  hi = std::min<uint32_t>(hi, 0x10FFFF);
  if (lo > hi) return;
  if (lo < 0xD800 && hi > 0xDFFF) {  // surrogates have no UTF-8 form
    split_range(lo, 0xD7FF, out);
    split_range(0xE000, hi, out);
  } else if (lo >= 0xD800 && hi <= 0xDFFF) {
    return;
  } else {
    split_range(lo >= 0xD800 && lo <= 0xDFFF ? 0xE000 : lo, hi >= 0xD800 && hi <= 0xDFFF ? 0xD7FF : hi, out);
  }
}

Expr codepoint_class(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<Expr> alts;
  ByteSet ascii;  // one byte set for the whole ASCII part keeps the automaton small
  for (auto [lo, hi] : ranges) {
    if (lo < 0x80) {
      ascii.set_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(std::min<uint32_t>(hi, 0x7F)));
      if (hi < 0x80) continue;
      lo = 0x80;
    }
    utf8_range_alts(lo, hi, alts);
  }
  if (!ascii.empty()) alts.insert(alts.begin(), Expr::byte_set(ascii));
  if (alts.empty()) throw Error("grammar: empty character class");
  return Expr::alt(std::move(alts));
}

uint32_t GrammarBuilder::rule(const std::string& name) {
  auto [it, fresh] = index_.emplace(name, static_cast<uint32_t>(names_.size()));
  if (!fresh) return it->second;
  names_.push_back(name);
  bodies_.emplace_back();
  defined_.push_back(false);
  return static_cast<uint32_t>(names_.size() - 1);
}

bool GrammarBuilder::has_rule(const std::string& name) const {
  return index_.count(name) > 0;
}

void GrammarBuilder::define(uint32_t rule, Expr body) {
  bodies_[rule] = std::move(body);
  defined_[rule] = true;
}

// Lowers Expr trees to flat alternatives. Repetitions become right-recursive rules whose
// alternatives inline the repeated expression's own alternatives, so that a repeated byte set
// keeps its stack node (a tail call), which the token-mask cache relies on.
class Flattener {
 public:
  using Item = Grammar::Elem;
  Flattener(const GrammarBuilder& b, Grammar& g) : b_(b), g_(g) {}

  void run() {
    for (uint32_t r = 0; r < b_.size(); ++r) {
      if (!b_.defined(r)) fail("grammar: rule '", b_.name(r), "' is used but not defined");
      alts_.emplace_back();
      g_.names_.push_back(b_.name(r));
    }
    for (uint32_t r = 0; r < b_.size(); ++r) add_alternatives(r, b_.body(r), {});
    for (auto& rule_alts : alts_) {
      g_.rule_alts_.emplace_back();
      for (auto& items : rule_alts) {
        g_.rule_alts_.back().push_back(static_cast<uint32_t>(g_.elems_.size()));
        g_.elems_.insert(g_.elems_.end(), items.begin(), items.end());
        g_.elems_.push_back({Grammar::Kind::End, 0});
      }
      if (g_.elems_.size() > kMaxElems) throw Error("grammar: too large");
    }
  }

 private:
  uint32_t new_rule(const std::string& name) {
    alts_.emplace_back();
    g_.names_.push_back(name);
    return static_cast<uint32_t>(alts_.size() - 1);
  }
  static std::vector<const Expr*> alternatives_of(const Expr& e) {
    std::vector<const Expr*> out;
    if (e.kind == Expr::Kind::Alt)
      for (auto& k : e.kids) out.push_back(&k);
    else
      out.push_back(&e);
    return out;
  }
  // Adds each alternative of `e`, followed by `tail` (if not empty), to `rule`.
  void add_alternatives(uint32_t rule, const Expr& e, std::vector<Item> tail) {
    for (const Expr* a : alternatives_of(e)) {
      std::vector<Item> items;
      flatten(*a, items, rule);
      items.insert(items.end(), tail.begin(), tail.end());
      alts_[rule].push_back(std::move(items));
    }
  }
  uint32_t set_index(const ByteSet& s) {
    auto [it, fresh] = set_ids_.try_emplace(s.w, static_cast<uint32_t>(g_.sets_.size()));
    if (fresh) g_.sets_.push_back(s);
    return it->second;
  }
  void flatten(const Expr& e, std::vector<Item>& out, uint32_t owner) {
    if (++count_ > kMaxElems) throw Error("grammar: too large");
    switch (e.kind) {
      case Expr::Kind::Bytes:
        out.push_back({Grammar::Kind::Bytes, set_index(e.bytes)});
        break;
      case Expr::Kind::Seq:
        for (auto& k : e.kids) flatten(k, out, owner);
        break;
      case Expr::Kind::Ref:
        out.push_back({Grammar::Kind::Ref, e.rule});
        break;
      case Expr::Kind::Alt: {
        uint32_t r = new_rule(g_.names_[owner] + "-alt");
        add_alternatives(r, e, {});
        out.push_back({Grammar::Kind::Ref, r});
        break;
      }
      case Expr::Kind::Repeat:
        flatten_repeat(e, out, owner);
        break;
    }
  }
  void flatten_repeat(const Expr& e, std::vector<Item>& out, uint32_t owner) {
    const Expr& kid = e.kids[0];
    for (int i = 0; i < e.min; ++i) flatten(kid, out, owner);
    if (e.max >= 0 && e.max <= e.min) return;
    if (e.max < 0) {
      uint32_t r = new_rule(g_.names_[owner] + "-star");
      add_alternatives(r, kid, {{Grammar::Kind::Ref, r}});
      alts_[r].push_back({});
      out.push_back({Grammar::Kind::Ref, r});
      return;
    }
    // x{0,k}: O_j ::= x O_{j-1} | empty, nested so that a count is never exceeded.
    std::vector<Item> tail;
    for (int j = 0; j < e.max - e.min; ++j) {
      uint32_t r = new_rule(g_.names_[owner] + "-opt");
      add_alternatives(r, kid, tail);
      alts_[r].push_back({});
      tail = {{Grammar::Kind::Ref, r}};
    }
    out.insert(out.end(), tail.begin(), tail.end());
  }

  const GrammarBuilder& b_;
  Grammar& g_;
  std::vector<std::vector<std::vector<Item>>> alts_;
  std::map<std::array<uint64_t, 4>, uint32_t> set_ids_;
  size_t count_ = 0;
};

std::shared_ptr<const Grammar> Grammar::build(const GrammarBuilder& b, const std::string& root) {
  if (!b.has_rule(root)) fail("grammar: no rule '", root, "'");
  auto g = std::make_shared<Grammar>();
  Flattener(b, *g).run();
  g->root_ = const_cast<GrammarBuilder&>(b).rule(root);
  g->compute_min_lengths();
  g->check_left_recursion();
  return g;
}

void Grammar::compute_min_lengths() {
  min_rule_.assign(rule_alts_.size(), kInf);
  best_alt_.assign(rule_alts_.size(), 0);
  auto alt_len = [&](uint32_t pos, uint32_t& n_elems) {
    uint64_t len = 0;
    for (n_elems = 0; elems_[pos].kind != Kind::End; ++pos, ++n_elems)
      len += elems_[pos].kind == Kind::Bytes ? 1 : min_rule_[elems_[pos].arg];
    return static_cast<uint32_t>(std::min<uint64_t>(len, kInf));
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < rule_alts_.size(); ++r) {
      for (uint32_t start : rule_alts_[r]) {
        uint32_t n = 0, len = alt_len(start, n);
        if (len < min_rule_[r]) min_rule_[r] = len, changed = true;
      }
    }
  }
  // The best alternative: shortest, then fewest elements (so that empty-width cycles end).
  for (uint32_t r = 0; r < rule_alts_.size(); ++r) {
    uint32_t best_n = kInf;
    for (uint32_t a = 0; a < rule_alts_[r].size(); ++a) {
      uint32_t n = 0, len = alt_len(rule_alts_[r][a], n);
      if (len == min_rule_[r] && n < best_n) best_n = n, best_alt_[r] = a;
    }
  }
  for (uint32_t r = 0; r < rule_alts_.size(); ++r)
    if (min_rule_[r] == kInf) fail("grammar: rule '", names_[r], "' matches no finite string");
  min_suffix_.assign(elems_.size(), 0);
  for (size_t i = elems_.size(); i-- > 0;) {
    if (elems_[i].kind == Kind::End) continue;
    uint32_t self = elems_[i].kind == Kind::Bytes ? 1 : min_rule_[elems_[i].arg];
    min_suffix_[i] = std::min<uint64_t>(uint64_t{self} + min_suffix_[i + 1], kInf);
  }
}

void Grammar::check_left_recursion() const {
  // Left edges: rule -> rule referenced before any byte must be consumed. A cycle through a
  // non-tail edge would grow the stack without consuming input.
  size_t n = rule_alts_.size();
  std::vector<std::vector<uint32_t>> edges(n);
  std::vector<std::pair<uint32_t, uint32_t>> non_tail;
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t pos : rule_alts_[r]) {
      for (; elems_[pos].kind == Kind::Ref; ++pos) {
        uint32_t x = elems_[pos].arg;
        edges[r].push_back(x);
        if (elems_[pos + 1].kind != Kind::End) non_tail.push_back({r, x});
        if (min_rule_[x] != 0) break;
      }
    }
  }
  for (auto [u, v] : non_tail) {
    std::vector<bool> seen(n, false);
    std::vector<uint32_t> todo{v};
    seen[v] = true;
    while (!todo.empty()) {
      uint32_t x = todo.back();
      todo.pop_back();
      if (x == u) fail("grammar: rule '", names_[u], "' is left-recursive (not supported)");
      for (uint32_t y : edges[x])
        if (!seen[y]) seen[y] = true, todo.push_back(y);
    }
  }
}

std::string Grammar::shortest_suffix(uint32_t pos) const {
  std::string out;
  // Explicit stack of positions; best alternatives have finite min lengths, so this ends.
  std::vector<uint32_t> todo{pos};
  size_t steps = 0;
  while (!todo.empty()) {
    uint32_t p = todo.back();
    todo.pop_back();
    if (++steps > 10'000'000) throw Error("grammar: shortest_suffix did not terminate");
    const Elem& e = elems_[p];
    if (e.kind == Kind::End) continue;
    todo.push_back(p + 1);
    if (e.kind == Kind::Bytes) {
      for (unsigned b = 0; b < 256; ++b)
        if (sets_[e.arg].test(static_cast<uint8_t>(b))) {
          out += static_cast<char>(b);
          break;
        }
    } else {
      todo.push_back(rule_alts_[e.arg][best_alt_[e.arg]]);
    }
  }
  return out;
}

std::string Grammar::to_string() const {
  std::string out;
  for (uint32_t r = 0; r < rule_alts_.size(); ++r) {
    out += names_[r] + "#" + std::to_string(r) + " ::=";
    for (size_t a = 0; a < rule_alts_[r].size(); ++a) {
      out += a ? " |" : "";
      for (uint32_t p = rule_alts_[r][a]; elems_[p].kind != Kind::End; ++p) {
        if (elems_[p].kind == Kind::Ref) {
          out += " " + names_[elems_[p].arg] + "#" + std::to_string(elems_[p].arg);
          continue;
        }
        out += " [";
        for (unsigned b = 0; b < 256; ++b)
          if (sets_[elems_[p].arg].test(static_cast<uint8_t>(b)))
            out += b >= 0x21 && b < 0x7F ? std::string(1, static_cast<char>(b)) : "\\x" + std::to_string(b);
        out += "]";
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace fathom::grammar
