// The intersection of regular languages as grammar rules: the strings that every expression
// matches (a regex's `pattern` and a `format`'s, or a pattern and a length), through the
// product of their automata (nfa.h). A grammar alone cannot intersect.
#pragma once
#include <cstddef>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/nfa.h"

namespace fathom::grammar {

struct Intersection {
  bool too_large = false;  // an automaton passed its bounds: no answer
  bool empty = false;      // no string is in every language
  Expr expr;               // otherwise: a reference to the product's start rule
};

// `langs`: regular expressions over bytes (no rule references).
Intersection intersect(const std::vector<Expr>& langs, const RuleSink& rules, size_t max_nfa_states = 65536,
                       size_t max_dfa_states = 16384);

}  // namespace fathom::grammar
