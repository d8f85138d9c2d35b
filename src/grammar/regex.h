// Regular expressions (a documented subset) compiled to grammar expressions, and the code point
// helpers shared with the GBNF parser.
//
// Supported: literals, escapes (\n \r \t \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation),
// classes [..] / [^..] with ranges, \d \D \w \W \s \S (ASCII meanings), '.' (any code point
// but \n), groups ( ) and (?: ), alternation |, quantifiers * + ? {n} {n,} {n,m} (a trailing lazy
// '?' is ignored), '^' at the start and '$' at the end (matches are always whole). Rejected with
// an error: backreferences, lookaround, \b \B, named groups, flags.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace fathom::grammar {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Decodes one UTF-8 code point at s[i] and advances i; throws fathom::Error if invalid.
uint32_t next_codepoint(std::string_view s, size_t& i);

struct RegexOptions {
  // Produce the text as the inside of a JSON string: '"', '\' and control characters are
  // emitted as JSON escapes, so that the decoded string matches the pattern.
  bool json_string = false;
};

Expr regex_to_expr(std::string_view pattern, const RegexOptions& opts = {});
// A grammar whose language is the regex (whole-match).
std::shared_ptr<const Grammar> grammar_from_regex(std::string_view pattern);
// A grammar matching exactly one of the strings (guided_choice).
std::shared_ptr<const Grammar> grammar_from_choices(const std::vector<std::string>& choices);

// One code point (from `ranges`) as text, or as JSON string content when json_string.
Expr class_expr(const Ranges& ranges, bool json_string);

}  // namespace fathom::grammar
