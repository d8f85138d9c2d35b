#include "grammar/nfa.h"

#include <algorithm>

#include "core/error.h"

namespace fathom::grammar {

uint32_t Nfa::add() {
  if (states.size() >= max_states) throw Error("automaton: expression too large");
  states.emplace_back();
  return static_cast<uint32_t>(states.size() - 1);
}

uint32_t Nfa::build(const Expr& e, uint32_t from) {
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
  throw Error("automaton: rule references are not regular");
}

std::vector<uint32_t> Nfa::closure(std::vector<uint32_t> set) const {
  std::vector<char> seen(states.size());
  for (uint32_t s : set) seen[s] = 1;
  for (size_t i = 0; i < set.size(); ++i)
    for (uint32_t t : states[set[i]].eps)
      if (!seen[t]) seen[t] = 1, set.push_back(t);
  std::sort(set.begin(), set.end());
  return set;
}

Subsets::Subsets(const Expr& e, size_t max_states) {
  nfa.max_states = max_states;
  const uint32_t start = nfa.add();
  nfa.final_state = nfa.build(e, start);
  intern(nfa.closure({start}));
}

int Subsets::intern(std::vector<uint32_t> s) {
  auto [it, fresh] = ids.try_emplace(std::move(s), static_cast<int>(sets.size()));
  if (fresh) sets.push_back(it->first);
  return it->second;
}

int Subsets::move(int id, unsigned b) {
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

ByteSet Subsets::takes(int id) const {
  ByteSet out;
  for (uint32_t s : sets[id])
    for (auto& [bytes, to] : nfa.states[s].edges)
      for (int w = 0; w < 4; ++w) out.w[w] |= bytes.w[w];
  return out;
}

bool Subsets::accepts(int id) const { return std::binary_search(sets[id].begin(), sets[id].end(), nfa.final_state); }

std::optional<Expr> dfa_rules(const Transitions& next, const std::vector<char>& accepting, const Expr& at_end,
                              const RuleSink& rules) {
  const size_t n = next.size();
  std::vector<std::vector<uint32_t>> prev(n);
  std::vector<char> live(n);
  std::vector<uint32_t> work;
  for (size_t s = 0; s < n; ++s) {
    for (auto& [b, t] : next[s]) prev[t].push_back(static_cast<uint32_t>(s));
    if (accepting[s]) live[s] = 1, work.push_back(static_cast<uint32_t>(s));
  }
  while (!work.empty()) {
    const uint32_t t = work.back();
    work.pop_back();
    for (uint32_t s : prev[t])
      if (!live[s]) live[s] = 1, work.push_back(s);
  }
  if (n == 0 || !live[0]) return std::nullopt;
  std::vector<uint32_t> rule(n);
  for (size_t s = 0; s < n; ++s)
    if (live[s]) rule[s] = rules.make();
  for (size_t s = 0; s < n; ++s) {
    if (!live[s]) continue;
    std::vector<Expr> alts;
    if (accepting[s]) alts.push_back(at_end);
    std::map<uint32_t, ByteSet> by_target;
    for (auto& [b, t] : next[s])
      if (live[t]) by_target[t].set(b);
    for (auto& [t, bytes] : by_target) alts.push_back(Expr::seq({Expr::byte_set(bytes), Expr::ref(rule[t])}));
    rules.define(rule[s], Expr::alt(std::move(alts)));
  }
  return Expr::ref(rule[0]);
}

}  // namespace fathom::grammar
