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

}  // namespace fathom::grammar
