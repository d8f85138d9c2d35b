// Regular languages of the front-ends' expressions as automata: Thompson's NFA of an Expr
// (Bytes, Seq, Alt, Repeat: what a regex compiles to; no rule references) and its subsets of
// states interned with memoized byte moves, for the product constructions that a grammar cannot
// express (intersections, complements: key_automaton.h, intersection.h). The products' states
// become grammar rules again through a RuleSink.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace fathom::grammar {

struct RuleSink {
  std::function<uint32_t()> make;              // a new rule
  std::function<void(uint32_t, Expr)> define;  // its body
};

struct Nfa {
  struct State {
    std::vector<uint32_t> eps;
    std::vector<std::pair<ByteSet, uint32_t>> edges;
  };
  std::vector<State> states;
  uint32_t final_state = 0;
  size_t max_states = 4096;  // past it, add() throws fathom::Error

  uint32_t add();
  // Adds `e` starting at `from` (only edges out of `from` are added to it); returns its end.
  // Throws fathom::Error on a rule reference.
  uint32_t build(const Expr& e, uint32_t from);
  std::vector<uint32_t> closure(std::vector<uint32_t> set) const;
};

// One NFA's reachable subsets of states, interned (id 0: the start's closure).
struct Subsets {
  Nfa nfa;
  std::map<std::vector<uint32_t>, int> ids;
  std::vector<std::vector<uint32_t>> sets;
  std::map<std::pair<int, unsigned>, int> moves;

  // The NFA of `e` (throws fathom::Error where it is not regular or too large).
  explicit Subsets(const Expr& e, size_t max_states = 4096);
  Subsets() = default;
  int intern(std::vector<uint32_t> s);
  int move(int id, unsigned byte);
  bool accepts(int id) const;
  bool dead(int id) const { return sets[id].empty(); }
  ByteSet takes(int id) const;  // the bytes some state of the subset has an edge on
};

// A deterministic automaton's transitions (per state: byte, target; state 0 the start).
using Transitions = std::vector<std::vector<std::pair<uint8_t, uint32_t>>>;

// The automaton as rules: one per state from which an accepting state can be reached, each
// taking a byte set to its target's rule, and `at_end` where it accepts. The start's rule, or
// nullopt where it reaches no accepting state.
std::optional<Expr> dfa_rules(const Transitions& next, const std::vector<char>& accepting, const Expr& at_end,
                              const RuleSink& rules);

}  // namespace fathom::grammar
