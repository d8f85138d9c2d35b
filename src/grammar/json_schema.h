// JSON Schema (2020-12, with the draft-04/06/07 spellings) and "any JSON object" compiled to
// grammars.
//
// Enforced: type, enum, const, properties, required, additionalProperties (false, true or a
// schema), patternProperties, propertyNames, minProperties, maxProperties, dependentRequired and
// dependentSchemas (draft-07 dependencies), items, prefixItems (draft-07 items arrays and
// additionalItems), minItems, maxItems, contains, minContains, uniqueItems, minLength, maxLength,
// pattern (the ECMA-262 subset of regex.h, searched as the spec says unless anchored), format
// (date, time, date-time, duration, email, hostname, ipv4, ipv6, uri, uri-reference, uuid),
// minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf (integers), allOf (merged),
// anyOf, oneOf (branches must be provably exclusive), if/then/else, not (of required, type,
// enum/const), $ref to anything inside the document ($defs, definitions, JSON pointers, $id,
// $anchor), with recursion. Annotations and unknown keywords (title, description, examples,
// readOnly, x-..., id, discriminator, OpenAPI formats such as int64, ...) are ignored and listed
// in SchemaReport::ignored. What cannot be enforced is refused naming keyword and JSON pointer,
// or with SchemaOptions::best_effort left unenforced and listed in SchemaReport::warnings.
//
// The grammar is a subset of the schema's language where the exact one is not context-free:
// properties in declaration order (required ones always present); no whitespace except an
// optional single space after ',' and ':'; extra keys (additionalProperties/patternProperties,
// or undeclared ones where additionalProperties is absent: SchemaOptions::undeclared_keys, by
// default only in objects that declare no key) come after the declared ones, are
// plain identifiers ([A-Za-z0-9_-]) unless patterns or propertyNames say otherwise, and never
// repeat a declared name; dependentRequired/dependentSchemas exact for up to 3 optional
// triggers (an alternative per combination), past that applied unconditionally; undeclared keys are not generated where patternProperties or
// unevaluatedProperties is present, nor inside oneOf branches, else branches and not (whose
// exclusivity proofs reason about the declared keys); numbers under bounds have no exponent, and fractions only between
// integers inside the bounds (at most 6 integer and 9 fraction digits); uniqueItems arrays have at
// most one item (unless their items are distinct constants); strings are valid UTF-8, escapes
// \" \\ \/ \b \f \n \r \t and \uXXXX outside the surrogate block.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace fathom::grammar {

// The keys an object without additionalProperties may take beyond those it declares.
enum class UndeclaredKeys {
  FreeForm,  // any, where it declares none ({"type": "object"}); else none (XGrammar's strict mode)
  Any,       // any, always (JSON Schema's own rule, llguidance's default)
  None,      // none: {"type": "object"} is {} (vLLM's disable_additional_properties)
};

struct SchemaOptions {
  // Leave what cannot be enforced unenforced (listed in SchemaReport::warnings) instead of failing.
  bool best_effort = false;
  UndeclaredKeys undeclared_keys = UndeclaredKeys::FreeForm;
};

struct SchemaReport {
  std::vector<std::string> ignored;   // "path: keyword" of annotations and unknown keywords
  std::vector<std::string> warnings;  // best effort: "keyword at path: why" left unenforced
};

// Throws fathom::Error naming the unsupported keyword (with its JSON pointer) or the problem.
std::shared_ptr<const Grammar> grammar_from_json_schema_json(const nlohmann::ordered_json& schema,
                                                             const SchemaOptions& opts = {},
                                                             SchemaReport* report = nullptr);
// Parses the schema text first (property order is kept); invalid JSON is an error.
std::shared_ptr<const Grammar> grammar_from_json_schema(std::string_view schema_text, const SchemaOptions& opts = {},
                                                        SchemaReport* report = nullptr);
// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_object_grammar();

}  // namespace fathom::grammar
