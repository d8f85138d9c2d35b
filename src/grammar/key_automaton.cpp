#include "grammar/key_automaton.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "grammar/regex.h"

namespace fathom::grammar {

namespace {

constexpr size_t kMaxDfaStates = 2048;
constexpr size_t kMaxRegexes = 16;

bool in_alphabet(unsigned b) { return b >= 0x20 && b <= 0x7E && b != '"' && b != '\\'; }
bool key_char(unsigned b) {
  return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') || b == '_' || b == '-';
}

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
                                                 uint64_t forbidden, const RuleSink& rules) {
  if (regexes.size() > kMaxRegexes) return std::nullopt;
  const size_t n = regexes.size();
  std::vector<Subsets> subsets;
  try {
    for (size_t i = 0; i < n; ++i) subsets.emplace_back(regex_to_expr(regexes[i]));
  } catch (const Error&) {
    return std::nullopt;
  }
  const Trie trie(names);

  // The reachable product states, but for those where no regex can match any more and the key
  // cannot be one of the others either; the classes' rules (dfa_rules) keep only the states that
  // can still end a key of their class.
  std::map<Product, uint32_t> ids;
  std::vector<Product> states;
  Transitions next;
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
        alive |= !subsets[i].dead(p[i]);
      }
      p[n] = trie.move(states[s][n], b);
      p[n + 1] = states[s][n + 1] && key_char(b);
      if (!alive && !(others && p[n + 1])) continue;
      uint32_t t = intern(std::move(p));
      next[s].emplace_back(static_cast<uint8_t>(b), t);
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

  std::vector<KeyClass> out;
  for (uint64_t c : classes) {  // the keys of class c: the automaton accepting where they end
    std::vector<char> accepting(states.size());
    for (size_t s = 0; s < states.size(); ++s) accepting[s] = ends[s] == c;
    if (std::optional<Expr> start = dfa_rules(next, accepting, Expr::literal("\""), rules))
      out.push_back({c, Expr::seq({Expr::literal("\""), std::move(*start)})});
  }
  return out;
}

}  // namespace fathom::grammar
