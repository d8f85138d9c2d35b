// JSON Schema (a subset) and "any JSON object" compiled to grammars.
//
// Supported keywords: type (object, array, string, number, integer, boolean, null, or a list),
// properties, required, additionalProperties (false or absent: only the declared properties;
// true or a schema: other keys may follow the declared ones), enum, const, items, minItems,
// maxItems, anyOf, oneOf (as anyOf), pattern (the subset of regex.h; the whole string must
// match), minLength, maxLength, $ref (JSON pointers into the document: #, #/$defs/.., ...),
// $defs and definitions. Annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly) are ignored. Any other keyword is an error naming it.
//
// Output form: properties in declaration order (required ones always present); no whitespace
// except an optional single space after ',' and ':' (the style of Python's json.dumps); strings
// are valid UTF-8, escapes \" \\ \/ \b \f \n \r \t and \uXXXX outside the surrogate block.
#pragma once
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace fathom::grammar {

// Throws fathom::Error naming the unsupported keyword (with its JSON pointer) or the problem.
std::shared_ptr<const Grammar> grammar_from_json_schema_json(const nlohmann::ordered_json& schema);
// Parses the schema text first (property order is kept); invalid JSON is an error.
std::shared_ptr<const Grammar> grammar_from_json_schema(std::string_view schema_text);
// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_object_grammar();

}  // namespace fathom::grammar
