// Object keys as one finite automaton: which of several regexes (patternProperties) a key
// matches and whether it is one of the declared names, so that an object's extra keys can be
// written exactly: each key with the schemas of every pattern it matches, never a declared
// name, and keys no pattern matches (additionalProperties) apart. A grammar cannot subtract
// or intersect languages; a product automaton can, and its states become rules again.
//
// Keys are over printable ASCII without '"' and '\' (their text is their value); a regex that
// needs more is written only within that alphabet (a subset), and one too large for the
// automaton's bounds gives nullopt (the caller keeps its simpler rules).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/nfa.h"

namespace fathom::grammar {

struct KeyClass {
  uint64_t patterns = 0;  // bit i: the key matches regex i; 0: no regex matches it
  Expr key;               // the key as a JSON string, quotes included
};

// One class per set of regexes some key matches (whole-string matches of `regexes`, at most 16),
// keys in `names` excluded; with `others`, also the class of non-empty keys no regex matches,
// made of letters, digits, '_' and '-'. Classes with no key, or matching a regex of `forbidden`
// (bit i: regex i), are left out.
std::optional<std::vector<KeyClass>> key_classes(const std::vector<std::string>& regexes,
                                                 const std::vector<std::string>& names, bool others,
                                                 uint64_t forbidden, const RuleSink& rules);

}  // namespace fathom::grammar
