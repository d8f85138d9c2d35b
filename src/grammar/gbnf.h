// GBNF text (llama.cpp's grammar format) compiled to a Grammar:
//   root ::= "{" ws pair ("," ws pair)* "}"      # comments run to the end of the line
//   pair ::= [a-z]+ ":" value?
// Terms: "literal" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [class] / [^class] over
// code points, '.' (any code point), rule names ([A-Za-z0-9_-]+), ( group ), and the postfix
// operators * + ? {m} {m,} {m,n}. A rule ends where the next `name ::=` begins. The start rule
// is `root`. Left recursion is rejected.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "grammar/grammar.h"

namespace fathom::grammar {

// Parses GBNF into `b` (rules keep their names). Throws fathom::Error with the line on errors.
void parse_gbnf(std::string_view text, GrammarBuilder& b);
std::shared_ptr<const Grammar> grammar_from_gbnf(std::string_view text, const std::string& root = "root");

}  // namespace fathom::grammar
