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
  std::vector<std::vector<std::pair<uint8_t, uint32_t>>> next;
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
  // The states from which a string of all the languages can still end, and a rule for each.
  std::vector<std::vector<uint32_t>> prev(states.size());
  std::vector<char> live(states.size());
  std::vector<uint32_t> work;
  auto accepts = [&](size_t s) {
    for (size_t i = 0; i < n; ++i)
      if (!parts[i].accepts(states[s][i])) return false;
    return true;
  };
  for (size_t s = 0; s < states.size(); ++s) {
    for (auto& [b, t] : next[s]) prev[t].push_back(static_cast<uint32_t>(s));
    if (accepts(s)) live[s] = 1, work.push_back(static_cast<uint32_t>(s));
  }
  while (!work.empty()) {
    const uint32_t t = work.back();
    work.pop_back();
    for (uint32_t s : prev[t])
      if (!live[s]) live[s] = 1, work.push_back(s);
  }
  if (!live[0]) {
    out.empty = true;
    return out;
  }
  std::vector<uint32_t> rule(states.size());
  for (size_t s = 0; s < states.size(); ++s)
    if (live[s]) rule[s] = rules.make();
  for (size_t s = 0; s < states.size(); ++s) {
    if (!live[s]) continue;
    std::vector<Expr> alts;
    if (accepts(s)) alts.push_back(Expr::empty());
    std::map<uint32_t, ByteSet> by_target;
    for (auto& [b, t] : next[s])
      if (live[t]) by_target[t].set(b);
    for (auto& [t, bytes] : by_target) alts.push_back(Expr::seq({Expr::byte_set(bytes), Expr::ref(rule[t])}));
    rules.define(rule[s], Expr::alt(std::move(alts)));
  }
  out.expr = Expr::ref(rule[0]);
  return out;
}

}  // namespace fathom::grammar
