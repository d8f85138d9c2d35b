// Internal to the JSON Schema front-end (json_schema.h): the compiler class shared by its
// concept files (json_schema.cpp: dispatch, $ref and combinators; schema_doc.cpp: draft
// spellings and the ignored keywords; schema_merge.cpp: allOf; schema_number.cpp: numeric
// bounds; schema_string.cpp: strings and formats; schema_object.cpp; schema_array.cpp).
//
// Soundness rule: every output of the grammar is valid under the schema (Python jsonschema
// decides); where the exact language is not context-free or too large, the grammar is a subset
// of it (property order, no exponent under numeric bounds, ...), documented in json_schema.h.
// What has no sound subset is refused, naming the keyword and its JSON pointer.
#pragma once
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace fathom::grammar::schema {

using Json = nlohmann::ordered_json;

// A JSON Schema `pattern` (an ECMA-262 search) as a regex matching whole strings.
std::string search_regex(const std::string& pattern, bool anchored_whole);
// Throws fathom::Error "json schema: unsupported keyword '<kw>' at <path>: <why>".
[[noreturn]] void refuse(const std::string& keyword, const std::string& path, const std::string& why);
// A subschema no instance satisfies. Refused where it decides the whole schema; an optional
// property or an anyOf / oneOf / if-then-else branch that has none is left out instead.
struct NoInstance : fathom::Error {
  using fathom::Error::Error;
};
[[noreturn]] void no_instance(const std::string& keyword, const std::string& path, const std::string& why);

// The document: $ref resolution (JSON pointers, $id and $anchor inside the document).
class SchemaDoc {
 public:
  explicit SchemaDoc(const Json& root);
  // The schema `ref` points to; throws (refuse) if it points outside the document or nowhere.
  const Json& resolve(const std::string& ref, const std::string& path) const;
  const Json& root() const { return root_; }

 private:
  void index(const Json& node, std::string base);
  const Json& root_;
  std::string base_;                        // the root's $id
  std::map<std::string, const Json*> ids_;  // absolute $id, "<base>#anchor" and "#anchor"
  std::map<std::string, std::vector<const Json*>> tails_;  // last path segment of each $id
};

// One schema object in canonical form: draft-04/07 spellings translated to 2020-12, annotations
// and unknown keywords removed (appended to `ignored` as "path: keyword").
Json normalize(const Json& s, const std::string& path, std::vector<std::string>& ignored);

// allOf of two normalized schemas as one normalized schema (a subset of the intersection where
// exact merging is impossible); refuses what has no sound merge.
Json merge(const Json& a, const Json& b, const std::string& path);

// Type names of a normalized schema (all seven when unconstrained).
std::vector<std::string> types_of(const Json& s);

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const SchemaOptions& opts, SchemaReport* report);
  std::shared_ptr<const Grammar> run();
  std::shared_ptr<const Grammar> any_object();

  // Shared rules (one set of grammar positions, so one token cache entry each).
  uint32_t common(const std::string& name);
  Expr as_rule(const std::string& hint, Expr e);
  uint32_t new_rule(const std::string& hint) { return b_.rule(hint + "-" + std::to_string(counter_++)); }
  void define(uint32_t rule, Expr e) { b_.define(rule, std::move(e)); }
  // Resolves a top-level $ref and allOf (repeatedly) into one normalized schema.
  Json flatten(Json s, const std::string& path, int depth = 0);
  bool never_both(const Json& gen, const Json& other, int depth = 0);
  // Whether s provably has no instance: unsatisfiable once flattened (its allOf merged), or an
  // object whose required property has none.
  bool has_no_instance(const Json& s, const std::string& path, int depth = 0);
  bool flat_has_no_instance(const Json& flat, const std::string& path, int depth = 0);  // s flattened already
  Expr compile(const Json& s, const std::string& path);

  Expr compile_number(const Json& s, bool integer, const std::string& path);
  Expr compile_string(const Json& s, const std::string& path);
  Expr compile_object(const Json& s, const std::string& path);
  Expr compile_array(const Json& s, const std::string& path);
  // Arrays of distinct values out of `vals` (at most kMaxUniqueValues of them): a rule per set of
  // values used so far, the array closing once min and growing while below max.
  Expr unique_values(const std::vector<Json>& vals, int min, int max);
  static constexpr size_t kMaxUniqueValues = 8;
  // The values a schema allows when they are a few constants (enum, const, boolean, false: none).
  std::optional<std::vector<Json>> constant_values(const Json& schema, const std::string& path);
  // Arrays of distinct constants, position i from prefix_vals[i] and then from item_vals (null:
  // no items past the prefix); nullopt past a bound on the grammar's size.
  std::optional<Expr> unique_tuples(const std::vector<std::vector<Json>>& prefix_vals, const std::vector<Json>* item_vals,
                                    int min, int max, const std::string& path);

  // A JSON string whose content matches the regex (JSON Schema `pattern` semantics: a search).
  Expr pattern_string(const std::string& pattern, const std::string& path, bool anchored_whole);
  Expr pattern_body(const std::string& pattern, const std::string& path, bool anchored_whole);
  Expr string_in_all(const std::vector<Expr>& langs, const char* keyword, const std::string& path, const std::string& what);
  // One JSON string character (a safe code point or an escape) as alternatives.
  static std::vector<Expr> char_alternatives();
  static Expr list(const char* open, Expr item, int min, int max, const char* close);
  static Expr sp() { return Expr::repeat(Expr::literal(" "), 0, 1); }
  static Expr digits(char lo, char hi);

  // compile_it(), or nullopt where it finds no instance (NoInstance). The rules the attempt
  // made are emptied (nothing refers to them: its $refs are forgotten, the shared rules kept),
  // so that they cost the vocabulary's classification nothing.
  template <class F>
  std::optional<Expr> unless_no_instance(F&& compile_it) {
    const uint32_t mark = uint32_t(b_.size());
    try {
      return compile_it();
    } catch (const NoInstance&) {
      for (auto it = refs_.begin(); it != refs_.end();) it = it->second >= mark ? refs_.erase(it) : std::next(it);
      for (uint32_t r = mark; r < b_.size(); ++r)
        if (!commons_.count(r)) b_.define(r, Expr::empty());
      return std::nullopt;
    }
  }

  // A refusal, or in best-effort mode a warning and `fallback` (the keyword left unenforced).
  void unsupported(const std::string& keyword, const std::string& path, const std::string& why);
  const Json& doc_resolve(const std::string& ref, const std::string& path) { return doc_.resolve(ref, path); }
  Json norm(const Json& s, const std::string& path);

 private:
  Expr compile_resolved(Json s, const std::string& path, int depth);
  Expr compile_ref(const std::string& ref, const std::string& path);
  Expr compile_combinator(const Json& s, const std::string& key, const std::string& path, int depth);
  Expr compile_conditional(const Json& s, const std::string& path, int depth);
  Expr compile_dependent_schemas(const Json& s, const std::string& path);
  Expr compile_not(Json s, const std::string& path, int depth);
  Expr compile_enum(const Json& s, const std::string& path);
  // A const / enum value as JSON text: containers with the grammar's optional space after ","
  // and ":", the keys of a small object in any order, an integral number also as N.0 (and zero
  // with a sign): the spellings JSON Schema counts as the same value.
  static Expr value_expr(const Json& v);

  // Whether an object without additionalProperties (declaring keys or not) may take undeclared
  // keys here: as the options say, but never while a branch whose exclusivity was proven on
  // declared keys is compiled.
  bool objects_open(bool declares_keys) const {
    if (closed_ > 0 || opts_.undeclared_keys == UndeclaredKeys::None) return false;
    return opts_.undeclared_keys == UndeclaredKeys::Any || !declares_keys;
  }
  // Compiles `e` with objects closed (oneOf branches, else branches, not).
  template <class F>
  Expr closed(F&& compile_it) {
    ++closed_;
    struct Leave {
      int& n;
      ~Leave() { --n; }
    } leave{closed_};
    return compile_it();
  }

  SchemaDoc doc_;
  SchemaOptions opts_;
  SchemaReport* report_;
  GrammarBuilder b_;
  std::map<std::string, uint32_t> refs_;  // keyed by the reference, "!" in front when closed
  std::set<uint32_t> commons_;            // the shared rules (common())
  int counter_ = 0;
  int closed_ = 0;
};

// never_both(gen, other) (a SchemaCompiler member, for $ref): true when instances generated from
// `gen` (objects carry only the properties it declares unless it allows others) can never be
// valid under `other`. Conservative: false when unsure.

// `s` without the keywords `keys`; whether `s` has any of them.
inline Json without(Json s, std::initializer_list<const char*> keys) {
  for (const char* k : keys) s.erase(k);
  return s;
}
inline bool has_any(const Json& s, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (s.contains(k)) return true;
  return false;
}

// Whether a value (of `enum`/`const`) satisfies the keywords of `s`; `unsure` is the answer
// when a keyword cannot be checked here (false to keep only values known valid).
bool value_satisfies(const Json& v, const Json& s, bool unsure = false);

}  // namespace fathom::grammar::schema
