// JSON Schema front-end: accepted instances, rejected ones, and errors naming what is unsupported.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

namespace fathom::grammar {
namespace {

bool full_match(const std::shared_ptr<const Grammar>& g, std::string_view s) {
  static auto vocab = testing::byte_vocab();
  Matcher m(CompiledGrammar::compile(g, vocab));
  return m.accept_bytes(s) && m.is_accepting();
}

std::string schema_error(const std::string& schema) {
  try {
    grammar_from_json_schema(schema);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarJsonSchema, ObjectWithRequiredAndOptionalProperties) {
  auto g = grammar_from_json_schema(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
    "required": ["name"], "additionalProperties": false})");
  EXPECT_TRUE(full_match(g, R"({"name":"Ann"})"));
  EXPECT_TRUE(full_match(g, R"({"name": "Ann", "age": -12, "tags": ["a", "b"]})"));
  EXPECT_TRUE(full_match(g, R"({"name":"A\"\\\n\u00e9 日本","tags":[]})"));
  EXPECT_FALSE(full_match(g, R"({"age":3})"));                   // missing required
  EXPECT_FALSE(full_match(g, R"({"name":"A","tags":["a","b","c"]})"));  // maxItems
  EXPECT_FALSE(full_match(g, R"({"name":"A","x":1})"));          // undeclared
  EXPECT_FALSE(full_match(g, R"({"name":"A","age":01})"));       // leading zero
  EXPECT_FALSE(full_match(g, "{\"name\":\"a\nb\"}"));            // raw control character
  EXPECT_FALSE(full_match(g, R"({"name":"\ud800"})"));           // surrogate escape
  EXPECT_FALSE(full_match(g, R"({ "name":"A"})"));               // whitespace policy
}

TEST(GrammarJsonSchema, TypesEnumConstAnyOfRefs) {
  auto g = grammar_from_json_schema(R"({
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": ["number", "null"]}, "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
    "type": "object",
    "properties": {
      "kind": {"enum": ["a", 1, null, true]},
      "fixed": {"const": {"x": [1, 2]}},
      "either": {"anyOf": [{"type": "boolean"}, {"type": "string", "maxLength": 3}]},
      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"},
      "list": {"$ref": "#/$defs/node"}},
    "required": ["kind", "fixed", "either", "code", "list"]})");
  EXPECT_TRUE(full_match(g, R"({"kind":1,"fixed":{"x":[1,2]},"either":true,"code":"AB-12","list":{"v":1.5e3,"next":{"v":null}}})"));
  EXPECT_TRUE(full_match(g, R"({"kind":null,"fixed":{"x":[1,2]},"either":"abc","code":"ZZ-0","list":{"v":-0.25}})"));
  EXPECT_FALSE(full_match(g, R"({"kind":2,"fixed":{"x":[1,2]},"either":true,"code":"AB-1","list":{"v":1}})"));
  EXPECT_FALSE(full_match(g, R"({"kind":1,"fixed":{"x":[1,2]},"either":"abcd","code":"AB-1","list":{"v":1}})"));
  EXPECT_FALSE(full_match(g, R"({"kind":1,"fixed":{"x":[1,2]},"either":true,"code":"Ab-1","list":{"v":1}})"));
}

TEST(GrammarJsonSchema, AdditionalPropertiesAndJsonObject) {
  auto g = grammar_from_json_schema(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(full_match(g, R"({})"));
  EXPECT_TRUE(full_match(g, R"({"a":1, "b":2})"));
  EXPECT_FALSE(full_match(g, R"({"a":"x"})"));
  auto o = json_object_grammar();
  EXPECT_TRUE(full_match(o, R"({"a":[1,{"b":null},"c",true,-1.5E+2],"d":{}})"));
  EXPECT_FALSE(full_match(o, R"([1])"));
  EXPECT_FALSE(full_match(o, R"({"a":})"));
}

TEST(GrammarJsonSchema, StringLengthsAndArrays) {
  auto g = grammar_from_json_schema(R"({"type":"array","items":{"type":"string","minLength":2,"maxLength":3},"minItems":1,"maxItems":3})");
  EXPECT_TRUE(full_match(g, R"(["ab"])"));
  EXPECT_TRUE(full_match(g, R"(["ab", "\u00e9\n", "日本語"])"));
  EXPECT_FALSE(full_match(g, R"([])"));
  EXPECT_FALSE(full_match(g, R"(["a"])"));
  EXPECT_FALSE(full_match(g, R"(["abcd"])"));
  EXPECT_FALSE(full_match(g, R"(["ab","ab","ab","ab"])"));
}

TEST(GrammarJsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(schema_error(R"({"type":"string","format":"date-time"})").find("unsupported keyword 'format' at #"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}}})")
                .find("unsupported keyword 'minimum' at #/properties/n"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"allOf":[{"type":"string"}]})").find("'allOf'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","patternProperties":{}})").find("'patternProperties'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"array","uniqueItems":true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"strin"})").find("unsupported type 'strin'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"#/$defs/missing"})").find("points nowhere"), std::string::npos);
  EXPECT_NE(schema_error(R"j({"type":"string","pattern":"(?=x)"})j").find("'pattern' at #"), std::string::npos);
  EXPECT_NE(schema_error("{bad json").find("invalid JSON"), std::string::npos);
  // Annotations are fine.
  EXPECT_EQ(schema_error(R"({"title":"t","description":"d","$schema":"x","type":"integer","default":1})"), "");
}

}  // namespace
}  // namespace fathom::grammar
