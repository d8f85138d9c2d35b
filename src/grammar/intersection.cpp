#include "grammar/intersection.h"

#include <map>

#include "core/error.h"

namespace fathom::grammar {

Intersection intersect(const std::vector<Expr>& langs, const RuleSink& rules, size_t max_nfa_states,
                       size_t max_dfa_states) {
  Intersection out;
  std::vector<Subsets> parts;
  try {
    for (const Expr& e : langs) parts.emplace_back(e, max_nfa_states);
  } catch (const Error&) {
    out.too_large = true;
    return out;
  }
  const size_t n = parts.size();
  // The reachable product states (each part's subset), without the ones where a part is dead.
  std::map<std::vector<int>, uint32_t> ids;
  std::vector<std::vector<int>> states;
  Transitions next;
  auto intern = [&](std::vector<int> p) {
    auto [it, fresh] = ids.try_emplace(std::move(p), static_cast<uint32_t>(states.size()));
    if (fresh) states.push_back(it->first), next.emplace_back();
    return it->second;
  };
  intern(std::vector<int>(n, 0));
  for (size_t s = 0; s < states.size(); ++s) {
    if (states.size() > max_dfa_states) {
      out.too_large = true;
      return out;
    }
    ByteSet bytes = parts[0].takes(states[s][0]);
    for (size_t i = 1; i < n; ++i) {
      const ByteSet b = parts[i].takes(states[s][i]);
      for (int w = 0; w < 4; ++w) bytes.w[w] &= b.w[w];
    }
    for (unsigned b = 0; b < 256; ++b) {
      if (!bytes.test(static_cast<uint8_t>(b))) continue;
      std::vector<int> p(n);
      bool alive = true;
      for (size_t i = 0; i < n && alive; ++i) alive = !parts[i].dead(p[i] = parts[i].move(states[s][i], b));
      if (alive) {
        const uint32_t t = intern(std::move(p));
        next[s].emplace_back(static_cast<uint8_t>(b), t);
      }
    }
  }
  std::vector<char> accepting(states.size(), 1);
  for (size_t s = 0; s < states.size(); ++s)
    for (size_t i = 0; i < n; ++i) accepting[s] &= parts[i].accepts(states[s][i]);
  if (std::optional<Expr> start = dfa_rules(next, accepting, Expr::empty(), rules))
    out.expr = std::move(*start);
  else
    out.empty = true;
  return out;
}

}  // namespace fathom::grammar
