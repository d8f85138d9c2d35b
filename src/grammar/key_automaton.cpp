#include "grammar/key_automaton.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "grammar/regex.h"

namespace fathom::grammar {

namespace {

constexpr size_t kMaxNfaStates = 4096;  // per regex
constexpr size_t kMaxDfaStates = 2048;
constexpr size_t kMaxRegexes = 16;

bool in_alphabet(unsigned b) { return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\'; }
bool key_char(unsigned b) {
  return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' || b == '-';
}

// Thompson's construction over the front-ends' expressions (a regex has no rule references).
struct Nfa {
  struct State {
    std::vector<uint32_t> eps;
    std::vector<std::pair<ByteSet, uint32_t>> edges;
  };
  std::vector<State> states;
  uint32_t final_state = 0;

  uint32_t add() {
    if (states.size() >= kMaxNfaStates) throw Error("key automaton: regex too large");
    states.emplace_back();
    return static_cast<uint32_t>(states.size() - 1);
  }
  // Adds `e` starting at `from` (only edges out of `from` are added to it); returns its end.
  uint32_t build(const Expr& e, uint32_t from) {
    switch (e.kind) {
      case Expr::Kind::Bytes: {
        uint32_t to = add();
        states[from].edges.emplace_back(e.bytes, to);
        return to;
      }
      case Expr::Kind::Seq:
        for (const Expr& k : e.kids) from = build(k, from);
        return from;
      case Expr::Kind::Alt: {
        uint32_t end = add();
        for (const Expr& k : e.kids) {
          uint32_t start = add();
          states[from].eps.push_back(start);
          states[build(k, start)].eps.push_back(end);
        }
        return end;
      }
      case Expr::Kind::Repeat: {
        const Expr& kid = e.kids[0];
        for (int i = 0; i < e.min; ++i) from = build(kid, from);
        if (e.max >= 0 && e.max <= e.min) return from;
        uint32_t end = add();
        states[from].eps.push_back(end);
        if (e.max < 0) {
          uint32_t loop = add();
          states[from].eps.push_back(loop);
          states[build(kid, loop)].eps.push_back(loop);
          states[loop].eps.push_back(end);
          return end;
        }
        for (int i = e.min; i < e.max; ++i) {
          from = build(kid, from);
          states[from].eps.push_back(end);
        }
        return end;
      }
      case Expr::Kind::Ref:
        break;
    }
    throw Error("key automaton: rule references are not regular");
  }
  std::vector<uint32_t> closure(std::vector<uint32_t> set) const {
    std::vector<char> seen(states.size());
    for (uint32_t s : set) seen[s] = 1;
    for (size_t i = 0; i < set.size(); ++i)
      for (uint32_t t : states[set[i]].eps)
        if (!seen[t]) seen[t] = 1, set.push_back(t);
    std::sort(set.begin(), set.end());
    return set;
  }
};

// One regex's subsets of NFA states, interned, with memoized byte moves.
struct Subsets {
  Nfa nfa;
  std::map<std::vector<uint32_t>, int> ids;
  std::vector<std::vector<uint32_t>> sets;
  std::map<std::pair<int, unsigned>, int> moves;

  int intern(std::vector<uint32_t> s) {
    auto [it, fresh] = ids.try_emplace(std::move(s), static_cast<int>(sets.size()));
    if (fresh) sets.push_back(it->first);
    return it->second;
  }
  int move(int id, unsigned b) {
    auto [it, fresh] = moves.try_emplace({id, b}, 0);
    if (!fresh) return it->second;
    std::vector<uint32_t> next;
    for (uint32_t s : sets[id])
      for (auto& [bytes, to] : nfa.states[s].edges)
        if (bytes.test(static_cast<uint8_t>(b))) next.push_back(to);
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    return it->second = intern(nfa.closure(std::move(next)));
  }
  bool accepts(int id) const { return std::binary_search(sets[id].begin(), sets[id].end(), nfa.final_state); }
};

// The names as a trie; -1 is off the trie.
struct Trie {
  std::vector<std::map<unsigned, int>> kids{{}};
  std::vector<bool> end{false};
  explicit Trie(const std::vector<std::string>& names) {
    for (const auto& n : names) {
      int at = 0;
      for (unsigned char ch : n) {
        auto it = kids[at].find(ch);
        if (it == kids[at].end()) {
          kids.emplace_back(), end.push_back(false);
          it = kids[at].emplace(ch, static_cast<int>(kids.size() - 1)).first;
        }
        at = it->second;
      }
      end[at] = true;
    }
  }
  int move(int at, unsigned b) const {
    if (at < 0) return -1;
    auto it = kids[at].find(b);
    return it == kids[at].end() ? -1 : it->second;
  }
};

// A product state: each regex's subset, the trie node, whether every byte was a key character.
using Product = std::vector<int>;

}  // namespace

std::optional<std::vector<KeyClass>> key_classes(const std::vector<std::string>& regexes,
                                                 const std::vector<std::string>& names, bool others,
                                                 uint64_t forbidden, const KeyRules& rules) {
  if (regexes.size() > kMaxRegexes) return std::nullopt;
  const size_t n = regexes.size();
  std::vector<Subsets> subsets(n);
  try {
    for (size_t i = 0; i < n; ++i) {
      Nfa& nfa = subsets[i].nfa;
      uint32_t start = nfa.add();
      nfa.final_state = nfa.build(regex_to_expr(regexes[i]), start);
      subsets[i].intern(nfa.closure({start}));
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  const Trie trie(names);

  // The reachable product states (dead ones, where nothing can be written any more, included:
  // the classes' rules below keep only the states that can still end a key of the class).
  std::map<Product, uint32_t> ids;
  std::vector<Product> states;
  std::vector<std::vector<std::pair<unsigned, uint32_t>>> next;
  auto intern = [&](Product p) {
    auto [it, fresh] = ids.try_emplace(std::move(p), static_cast<uint32_t>(states.size()));
    if (fresh) states.push_back(it->first), next.emplace_back();
    return it->second;
  };
  Product start(n, 0);
  start.push_back(0), start.push_back(1);
  intern(start);
  for (size_t s = 0; s < states.size(); ++s) {
    if (states.size() > kMaxDfaStates) return std::nullopt;
    for (unsigned b = 0; b < 256; ++b) {
      if (!in_alphabet(b)) continue;
      Product p(n + 2);
      bool alive = false;
      for (size_t i = 0; i < n; ++i) {
        p[i] = subsets[i].move(states[s][i], b);
        alive |= !subsets[i].sets[p[i]].empty();
      }
      p[n] = trie.move(states[s][n], b);
      p[n + 1] = states[s][n + 1] && key_char(b);
      if (!alive && !(others && p[n + 1])) continue;
      uint32_t t = intern(std::move(p));
      next[s].emplace_back(b, t);
    }
  }

  // Each state's class where a key may end there: the regexes it matches (bit i), or 0 for a
  // key no regex matches (with `others`, non-empty, key characters only); none for names.
  std::vector<std::optional<uint64_t>> ends(states.size());
  for (size_t s = 0; s < states.size(); ++s) {
    const Product& p = states[s];
    if (p[n] >= 0 && trie.end[p[n]]) continue;
    uint64_t m = 0;
    for (size_t i = 0; i < n; ++i)
      if (subsets[i].accepts(p[i])) m |= uint64_t{1} << i;
    if (m) ends[s] = m;
    else if (others && p[n + 1] && s != 0) ends[s] = 0;
  }
  std::vector<uint64_t> classes;
  for (auto& e : ends)
    if (e && !(*e & forbidden) && std::find(classes.begin(), classes.end(), *e) == classes.end()) classes.push_back(*e);
  std::sort(classes.begin(), classes.end());

  std::vector<std::vector<uint32_t>> prev(states.size());
  for (size_t s = 0; s < states.size(); ++s)
    for (auto& [b, t] : next[s]) prev[t].push_back(static_cast<uint32_t>(s));
  std::vector<KeyClass> out;
  for (uint64_t c : classes) {
    // States from which a key of class c can still end, and a rule for each.
    std::vector<char> live(states.size());
    std::vector<uint32_t> work;
    for (size_t s = 0; s < states.size(); ++s)
      if (ends[s] == c) live[s] = 1, work.push_back(static_cast<uint32_t>(s));
    while (!work.empty()) {
      uint32_t t = work.back();
      work.pop_back();
      for (uint32_t s : prev[t])
        if (!live[s]) live[s] = 1, work.push_back(s);
    }
    if (!live[0]) continue;
    std::vector<uint32_t> rule(states.size());
    for (size_t s = 0; s < states.size(); ++s)
      if (live[s]) rule[s] = rules.make();
    for (size_t s = 0; s < states.size(); ++s) {
      if (!live[s]) continue;
      std::vector<Expr> alts;
      if (ends[s] == c) alts.push_back(Expr::literal("\""));
      std::map<uint32_t, ByteSet> by_target;
      for (auto& [b, t] : next[s])
        if (live[t]) by_target[t].set(static_cast<uint8_t>(b));
      for (auto& [t, bytes] : by_target) alts.push_back(Expr::seq({Expr::byte_set(bytes), Expr::ref(rule[t])}));
      rules.define(rule[s], Expr::alt(std::move(alts)));
    }
    out.push_back({c, Expr::seq({Expr::literal("\""), Expr::ref(rule[0])})});
  }
  return out;
}

}  // namespace fathom::grammar
