// JSON Schema front-end: accepted instances, rejected ones, and errors naming what is unsupported.
#include <cstdio>
#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

TEST(GrammarJsonSchema, UnenforceableKeywordsAreNamed) {
  EXPECT_NE(schema_error(R"({"type":"array","contains":{},"maxContains":1})").find("unsupported keyword 'maxContains' at #"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"n":{"type":"number","multipleOf":0.5}}})")
                .find("unsupported keyword 'multipleOf' at #/properties/n"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":3}]})").find("'oneOf'"),
            std::string::npos);  // overlapping branches: "exactly one" is not expressible
  EXPECT_NE(schema_error(R"({"type":"string","not":{"pattern":"a"}})").find("'not'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"#/$defs/missing"})").find("points nowhere"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"https://example.com/other.json"})").find("outside the document"), std::string::npos);
  EXPECT_NE(schema_error(R"j({"type":"string","pattern":"(?=x)"})j").find("'pattern' at #"), std::string::npos);
  EXPECT_NE(schema_error("{bad json").find("invalid JSON"), std::string::npos);
  // Annotations and unknown keywords are fine, and listed.
  SchemaReport report;
  grammar_from_json_schema(R"({"title":"t","description":"d","$schema":"x","type":"integer","default":1,"x-k":2,
                               "readonly":true,"example":3,"id":"a","version":"1"})", {}, &report);
  EXPECT_EQ(report.ignored.size(), 9u);
  // Best effort: the refusal becomes a warning.
  SchemaReport best;
  grammar_from_json_schema(R"({"type":"array","contains":{},"maxContains":1})", {true}, &best);
  ASSERT_EQ(best.warnings.size(), 1u);
  EXPECT_NE(best.warnings[0].find("maxContains"), std::string::npos);
}

// A subschema with no instance is left out where it may be: an optional property is never
// written, a branch of anyOf / oneOf / if-then-else adds nothing; where it decides the whole
// schema it is refused. $refs compiled during a failed attempt are compiled again, not reused
// (properties compile last to first: t's u, and u's reference to t, come before t fails).
TEST(GrammarJsonSchema, SubschemasWithoutInstancesAreLeftOut) {
  auto opt = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"allOf":[{"const":1},{"const":2}]},
      "c":{"if":{"type":"string"},"then":{"enum":[1],"const":2},"else":{"allOf":[{"const":1},{"const":2}]}}}})");
  EXPECT_TRUE(full_match(opt, R"({"a":1})") && full_match(opt, "{}"));
  EXPECT_FALSE(full_match(opt, R"({"a":1,"b":1})") || full_match(opt, R"({"b":2})") || full_match(opt, R"({"c":1})"));
  auto any = grammar_from_json_schema(R"({"anyOf":[{"allOf":[{"const":1},{"const":2}]},{"type":"string"}]})");
  EXPECT_TRUE(full_match(any, R"("s")"));
  EXPECT_FALSE(full_match(any, "1"));
  auto one = grammar_from_json_schema(R"({"type":"object","properties":{"k":{"const":"x"}},"oneOf":[
      {"properties":{"k":{"enum":["y"]},"n":{"type":"integer"}},"required":["k"]},
      {"properties":{"k":{"const":"x"},"s":{"type":"string"}},"required":["k"]}]})");
  EXPECT_TRUE(full_match(one, R"({"k":"x","s":"t"})"));
  EXPECT_FALSE(full_match(one, R"({"k":"y"})") || full_match(one, R"({"k":"x","n":1})"));
  auto cond = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"},"c":{"type":"boolean"}},
      "if":{"required":["a"]},"then":{"properties":{"a":{"allOf":[{"const":1},{"const":2}]}}}})");
  EXPECT_TRUE(full_match(cond, "{}") && full_match(cond, R"({"c":true})"));
  EXPECT_FALSE(full_match(cond, R"({"a":1})"));
  auto refs = grammar_from_json_schema(R"({"$defs":{
      "t":{"type":"object","properties":{"dead":{"enum":[1],"const":2},"u":{"$ref":"#/$defs/u"}},"required":["dead"]},
      "u":{"type":"object","properties":{"t":{"$ref":"#/$defs/t"},"v":{"type":"integer"}}}},
      "type":"object","properties":{"a":{"$ref":"#/$defs/t"},"b":{"$ref":"#/$defs/u"},"c":{"$ref":"#/$defs/t"}}})");
  EXPECT_TRUE(full_match(refs, R"({"b":{"v":1}})") && full_match(refs, R"({"b":{}})"));
  EXPECT_FALSE(full_match(refs, R"({"a":{}})") || full_match(refs, R"({"b":{"t":{}}})") || full_match(refs, R"({"c":{}})"));
  // Where the whole schema has no instance, the refusal names the keyword and where.
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"b":false},"required":["b"]})").find("required property 'b' is not allowed"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"anyOf":[{"allOf":[{"const":1},{"const":2}]},{"enum":[1],"const":2}]})").find("'anyOf' at #"),
            std::string::npos);
}

// oneOf exclusivity seen through merges: a oneOf beside another (a $ref to one), and branches
// told apart by a constant that the outer schema's property also constrains (GitHub's
// workflow schema has both).
TEST(GrammarJsonSchema, OneOfProofsSeeMergedSchemas) {
  auto both = grammar_from_json_schema(R"({"$defs":{"either":{"oneOf":[{"type":"object"},{"type":"null"}]}},
      "$ref":"#/$defs/either","oneOf":[{"type":"null"},{"type":"object","properties":{"w":{"type":"integer"}}}]})");
  EXPECT_TRUE(full_match(both, "null") && full_match(both, R"({"w":1})"));
  EXPECT_FALSE(full_match(both, R"({"w":"s"})") || full_match(both, "1"));
  auto input = grammar_from_json_schema(R"({"type":"object","properties":{"type":{"type":"string","enum":["s","b"]},"d":{}},
      "additionalProperties":false,"oneOf":[
        {"properties":{"type":{"const":"s"},"d":{"type":"string"}},"required":["type"]},
        {"properties":{"type":{"const":"b"},"d":{"type":"boolean"}},"required":["type"]}]})");
  EXPECT_TRUE(full_match(input, R"({"type":"s","d":"x"})") && full_match(input, R"({"type":"b","d":true})"));
  EXPECT_FALSE(full_match(input, R"({"type":"s","d":true})") || full_match(input, R"({"d":"x"})"));
  // Closed objects with keys of their own (woodpecker's secret targets): {} would match both, so
  // each branch requires its own key.
  auto target = grammar_from_json_schema(R"({"oneOf":[
      {"type":"object","additionalProperties":false,"properties":{"env":{"type":"string"}}},
      {"type":"object","additionalProperties":false,"properties":{"file":{"type":"string"}}}]})");
  EXPECT_TRUE(full_match(target, R"({"env":"E"})") && full_match(target, R"({"file":"f"})"));
  EXPECT_FALSE(full_match(target, "{}") || full_match(target, R"({"env":"E","file":"f"})"));
  // not {type: object, required: [...]} (GitHub's push filters: not both branches and
  // branches-ignore): one of the names left out, as for a bare `required`.
  auto filters = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},
      "additionalProperties":false,"not":{"type":"object","required":["a","b"]}})");
  EXPECT_TRUE(full_match(filters, R"({"b":2})") && full_match(filters, "{}"));
  EXPECT_FALSE(full_match(filters, R"({"a":1,"b":2})"));
}

TEST(GrammarJsonSchema, NumericBounds) {
  auto g = grammar_from_json_schema(R"({"type":"integer","minimum":-12,"exclusiveMaximum":305})");
  for (int v = -20; v < 320; ++v) EXPECT_EQ(full_match(g, std::to_string(v)), v >= -12 && v < 305) << v;
  auto n = grammar_from_json_schema(R"({"type":"number","minimum":0.5,"maximum":3})");
  EXPECT_TRUE(full_match(n, "1") && full_match(n, "2.75") && full_match(n, "3") && full_match(n, "1.5"));
  EXPECT_FALSE(full_match(n, "0") || full_match(n, "3.5") || full_match(n, "-1") || full_match(n, "1e2"));
  auto m = grammar_from_json_schema(R"({"type":"integer","multipleOf":7})");
  for (int v = -50; v < 100; ++v) EXPECT_EQ(full_match(m, std::to_string(v)), v % 7 == 0) << v;
  // Decimal bounds, exactly: every number with up to 3 fraction digits in [-4, 4] is accepted iff
  // its double passes the bounds (as Python jsonschema compares), e.g. 1.1 at minimum 1.1, 3.0
  // at maximum 3, -0.5 above exclusiveMinimum -0.55.
  for (const char* schema : {R"({"type":"number","minimum":1.1,"maximum":3})",
                             R"({"type":"number","exclusiveMinimum":-0.55,"exclusiveMaximum":2.125})",
                             R"({"type":"number","minimum":-2.75,"exclusiveMaximum":-1.5})",
                             R"({"type":"number","exclusiveMinimum":0,"maximum":1.05e-1})",
                             R"({"type":"number","minimum":-1.25})"}) {
    auto b = CompiledGrammar::compile(grammar_from_json_schema(schema), testing::byte_vocab());
    auto doc = nlohmann::json::parse(schema);
    for (int v = -4000; v <= 4000; ++v)
      for (int digits = 0; digits <= 3; ++digits) {
        if (digits < 3 && v % (digits == 0 ? 1000 : digits == 1 ? 100 : 10) != 0) continue;
        char text[32];
        std::snprintf(text, sizeof text, "%s%d.%0*d", v < 0 ? "-" : "", std::abs(v) / 1000, 3, std::abs(v) % 1000);
        std::string t(text);
        t.resize(t.size() - (3 - digits) - (digits == 0 ? 1 : 0));  // x, x.y, x.yz, x.yzw
        if (t == "-0" || t == "-0.0" || t == "-0.00" || t == "-0.000") continue;  // signed zero: a subset
        double x = std::strtod(t.c_str(), nullptr);
        bool valid = (!doc.contains("minimum") || x >= doc["minimum"].get<double>()) &&
                     (!doc.contains("maximum") || x <= doc["maximum"].get<double>()) &&
                     (!doc.contains("exclusiveMinimum") || x > doc["exclusiveMinimum"].get<double>()) &&
                     (!doc.contains("exclusiveMaximum") || x < doc["exclusiveMaximum"].get<double>());
        Matcher m(b);
        ASSERT_EQ(m.accept_bytes(t) && m.is_accepting(), valid) << schema << " " << t;
      }
  }
  auto d4 = grammar_from_json_schema(R"({"type":"integer","minimum":5,"exclusiveMinimum":true})");  // draft-04
  EXPECT_FALSE(full_match(d4, "5"));
  EXPECT_TRUE(full_match(d4, "6"));
}

TEST(GrammarJsonSchema, FormatsAndPatterns) {
  auto date = grammar_from_json_schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(full_match(date, R"("2024-02-28T13:05:00Z")"));
  EXPECT_FALSE(full_match(date, R"("2024-02-30T13:05:00Z")"));
  auto ip = grammar_from_json_schema(R"({"format":"ipv4"})");
  EXPECT_TRUE(full_match(ip, R"("192.168.0.255")"));
  EXPECT_FALSE(full_match(ip, R"("256.1.1.1")"));
  EXPECT_TRUE(full_match(date, R"("2024-02-28t13:05:00z")"));  // RFC 3339: T and Z in either case
  // RFC 3986 URIs (any scheme) and IPv6 addresses: each case's verdict is Python jsonschema's.
  auto uri = grammar_from_json_schema(R"({"type":"string","format":"uri"})");
  for (const char* ok : {R"("mailto:John.Doe@example.com")", R"("urn:oasis:names:specification:docbook:dtd:xml:4.1.2")",
                         R"("ldap://[2001:db8::7]/c=GB?objectClass?one")",
                         R"("http://foo.bar/?q=Test%20URL-encoded%20stuff#frag")"})
    EXPECT_TRUE(full_match(uri, ok)) << ok;
  for (const char* bad : {R"("//foo.bar/?baz=qux#quux")", R"("http:// shouldfail.com")", R"("bar,baz:foo")",
                          R"("http://a/%zz")"})
    EXPECT_FALSE(full_match(uri, bad)) << bad;
  auto ip6 = grammar_from_json_schema(R"({"type":"string","format":"ipv6"})");
  for (const char* ok : {R"("::ffff:192.168.0.1")", R"("1:2:3:4:5:6:7::")", R"("::")", R"("::1:2:3:4:5:6:7")"})
    EXPECT_TRUE(full_match(ip6, ok)) << ok;
  for (const char* bad : {R"("1:2:3:4:5:6:7:8:9")", R"("12345::")", R"("1::2::3")", R"("::ffff:256.1.1.1")"})
    EXPECT_FALSE(full_match(ip6, bad)) << bad;
  // enum/const: the same value in the spellings JSON Schema equates, and no other.
  auto obj = grammar_from_json_schema(R"({"const":{"foo":"bar","baz":[1, 2.0]}})");
  for (const char* ok : {R"({"foo":"bar","baz":[1,2.0]})", R"({"baz": [1.0, 2], "foo": "bar"})"})
    EXPECT_TRUE(full_match(obj, ok)) << ok;
  for (const char* bad : {R"({"foo":"bar"})", R"({"foo":"bar","baz":[1,2.5]})", R"({"foo":"bar","baz":[true,2]})"})
    EXPECT_FALSE(full_match(obj, bad)) << bad;
  auto zero = grammar_from_json_schema(R"({"enum":[0, "x"]})");
  for (const char* ok : {"0", "0.0", "-0", "-0.0", R"("x")"}) EXPECT_TRUE(full_match(zero, ok)) << ok;
  for (const char* bad : {"false", "0.5", "00"}) EXPECT_FALSE(full_match(zero, bad)) << bad;
  auto search = grammar_from_json_schema(R"({"type":"string","pattern":"ab+"})");  // a search, not a whole match
  EXPECT_TRUE(full_match(search, R"("xxabbby")"));
  EXPECT_FALSE(full_match(search, R"("xxa")"));
  auto anchored = grammar_from_json_schema(R"({"type":"string","pattern":"^ab+$"})");
  EXPECT_FALSE(full_match(anchored, R"("xab")"));
}

// pattern with minLength/maxLength, and format with pattern or lengths: the product of their
// automata, exactly (lengths in code points, an escape counting once).
TEST(GrammarJsonSchema, PatternsWithLengthsAndFormats) {
  auto g = grammar_from_json_schema(R"({"type":"string","pattern":"^[a-z]+$","minLength":2,"maxLength":4})");
  for (const char* ok : {R"("ab")", R"("abcd")"}) EXPECT_TRUE(full_match(g, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcde")", R"("aB")"}) EXPECT_FALSE(full_match(g, bad)) << bad;
  auto search = grammar_from_json_schema(R"({"type":"string","pattern":"x","maxLength":3})");
  for (const char* ok : {R"("x")", R"("éxé")", R"("\nx\"")"}) EXPECT_TRUE(full_match(search, ok)) << ok;
  for (const char* bad : {R"("")", R"("abc")", R"("abcx")", R"("éééx")"}) EXPECT_FALSE(full_match(search, bad)) << bad;
  auto web = grammar_from_json_schema(R"({"type":"string","format":"uri","pattern":"^(https|ftp)://"})");
  EXPECT_TRUE(full_match(web, R"("https://example.com/a")") && full_match(web, R"("ftp://h")"));
  EXPECT_FALSE(full_match(web, R"("http://example.com")"));
  EXPECT_FALSE(full_match(web, R"("https://a b")"));  // the pattern alone would take it
  auto day = grammar_from_json_schema(R"({"type":"string","format":"date","pattern":"-12-"})");
  EXPECT_TRUE(full_match(day, R"("2024-12-31")"));
  EXPECT_FALSE(full_match(day, R"("2024-11-30")") || full_match(day, R"("2024-12-32")"));
  EXPECT_NE(schema_error(R"({"type":"string","pattern":"^a+$","format":"uuid"})").find("'format'"), std::string::npos);
}

TEST(GrammarJsonSchema, ObjectKeywords) {
  auto g = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "patternProperties":{"^x-":{"type":"string"}},"additionalProperties":false,"maxProperties":2})");
  EXPECT_TRUE(full_match(g, R"({"a":1,"x-y":"s"})"));
  EXPECT_FALSE(full_match(g, R"({"a":1,"x-y":2})"));
  EXPECT_FALSE(full_match(g, R"({"a":1,"b":"s"})"));
  EXPECT_FALSE(full_match(g, R"({"a":1,"x-y":"s","x-z":"t"})"));
  // Patterns that overlap each other, a declared name, or sit beside additionalProperties: each
  // key takes the schemas of every pattern it matches, others additionalProperties'.
  auto pp = grammar_from_json_schema(R"({"type":"object","properties":{"foo":{"type":"array","maxItems":3}},
      "patternProperties":{"f.o":{"minItems":2},"^a+$":{"type":"integer"},"^aaa":{"maximum":20},"^b":false},
      "additionalProperties":{"type":"string"}})");
  for (const char* ok : {R"({"fxo": [1, 2]})", R"({"a": 21})", R"({"a": 21, "aaaa": 18})", R"({"foo": [1, 2, 3], "q": "s"})",
                         R"({"foo": [1, 2]})", R"({"fao": 1})"})
    EXPECT_TRUE(full_match(pp, ok)) << ok;
  for (const char* bad : {R"({"fxo": [1]})", R"({"aaaa": 21})", R"({"a": "s"})", R"({"q": 1})", R"({"bx": 1})",
                          R"({"foo": [1], "foo": [1, 2]})", R"({"fao": [1]})", R"({"foo": [1]})"})
    EXPECT_FALSE(full_match(pp, bad)) << bad;
  auto extra = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "additionalProperties":{"type":"boolean"},"minProperties":2,"dependentRequired":{"b":["a"]}})");
  EXPECT_TRUE(full_match(extra, R"({"a":1,"b":true})"));
  EXPECT_FALSE(full_match(extra, R"({"a":1,"a":true})"));  // an extra key never repeats a declared one
  EXPECT_FALSE(full_match(extra, R"({"a":1})"));           // minProperties
  auto all = grammar_from_json_schema(R"({"allOf":[{"$ref":"#/$defs/base"},{"required":["k"]}],
      "$defs":{"base":{"type":"object","properties":{"k":{"enum":["x","y"]},"n":{"type":"integer","minimum":0}}}}})");
  EXPECT_TRUE(full_match(all, R"({"k":"x","n":3})"));
  EXPECT_FALSE(full_match(all, R"({"n":3})"));
  EXPECT_FALSE(full_match(all, R"({"k":"x","n":-3})"));
  // dependentSchemas: the object without its trigger, or with it and the dependent schema.
  auto dep = grammar_from_json_schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{}},
      "dependentSchemas":{"a":{"required":["b"],"properties":{"b":{"type":"string"}}}}})");
  EXPECT_TRUE(full_match(dep, "{}") && full_match(dep, R"({"b":1})") && full_match(dep, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(full_match(dep, R"({"a":1})") || full_match(dep, R"({"a":1,"b":2})"));
  auto cond = grammar_from_json_schema(R"({"type":"object","properties":{"t":{"enum":["a","b"]},"v":{}},"required":["t"],
      "if":{"properties":{"t":{"const":"a"}}},"then":{"properties":{"v":{"type":"integer"}},"required":["v"]}})");
  EXPECT_TRUE(full_match(cond, R"({"t":"a","v":1})"));
  EXPECT_FALSE(full_match(cond, R"({"t":"a","v":"s"})"));
  EXPECT_FALSE(full_match(cond, R"({"t":"a"})"));
}

// An `if` (or a `not`) that is one numeric or length bound: the else branch takes the values past
// the bound (a value of another type passes the bound, so it goes to `then`).
TEST(GrammarJsonSchema, ConditionsOnOneBound) {
  auto g = grammar_from_json_schema(R"({"if":{"exclusiveMaximum":0},"then":{"minimum":-10},"else":{"multipleOf":2}})");
  EXPECT_TRUE(full_match(g, "-1") && full_match(g, "-10") && full_match(g, "0") && full_match(g, "4"));
  EXPECT_FALSE(full_match(g, "-11") || full_match(g, "3"));
  auto len = grammar_from_json_schema(R"({"type":"string","if":{"maxLength":2},"then":{"const":"ab"}})");
  EXPECT_TRUE(full_match(len, R"("ab")") && full_match(len, R"("xyz")"));
  EXPECT_FALSE(full_match(len, R"("xy")") || full_match(len, R"("a")"));
  auto neg = grammar_from_json_schema(R"({"type":"integer","not":{"minimum":5}})");
  EXPECT_TRUE(full_match(neg, "4") && full_match(neg, "-3"));
  EXPECT_FALSE(full_match(neg, "5"));
}

// Objects without additionalProperties: by default those that declare no key take any keys
// ({"type":"object"} is any object, not only {}) and those that declare some take only those
// (XGrammar's strict mode); UndeclaredKeys::Any allows other keys everywhere (JSON Schema's rule)
// after the declared ones, None nowhere. Where a proof of exclusivity reasons about keys (oneOf
// branches, else branches, not) objects stay closed, so a branch never writes a key another
// branch requires.
TEST(GrammarJsonSchema, UndeclaredKeys) {
  const char* schema = R"({"type":"object","properties":{"meta":{"type":"object"}},"required":["meta"]})";
  SchemaOptions any, none;
  any.undeclared_keys = UndeclaredKeys::Any;
  none.undeclared_keys = UndeclaredKeys::None;
  auto g = grammar_from_json_schema(schema);
  EXPECT_TRUE(full_match(g, R"({"meta":{"a":[1,{"b":null}],"c":"d"}})"));
  EXPECT_FALSE(full_match(g, R"({"meta":{}, "note":"x"})"));
  auto open = grammar_from_json_schema(schema, any);
  EXPECT_TRUE(full_match(open, R"({"meta":{}, "note":"x", "n":2})"));
  EXPECT_FALSE(full_match(open, R"({"note":"x"})"));            // required still required
  EXPECT_FALSE(full_match(open, R"({"meta":{},"meta":{}})"));   // never a declared name again
  auto closed = grammar_from_json_schema(schema, none);
  EXPECT_TRUE(full_match(closed, R"({"meta":{}})"));
  EXPECT_FALSE(full_match(closed, R"({"meta":{"a":1}})"));
  // oneOf told apart by required keys: a branch's output never carries the other's key.
  auto one = grammar_from_json_schema(R"({"oneOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
      {"type":"object","properties":{"b":{"type":"integer"}},"required":["b"]}]})", any);
  EXPECT_TRUE(full_match(one, R"({"a":1})"));
  EXPECT_TRUE(full_match(one, R"({"b":1})"));
  EXPECT_FALSE(full_match(one, R"({"a":1, "b":2})"));
  EXPECT_FALSE(full_match(one, R"({"a":1, "c":2})"));  // closed inside oneOf (a subset)
  // dependentRequired: an undeclared trigger is never a free extra key.
  auto dep = grammar_from_json_schema(R"({"type":"object","dependentRequired":{"bar":["foo"]}})", any);
  EXPECT_TRUE(full_match(dep, R"({"foo":1, "bar":2})"));
  EXPECT_FALSE(full_match(dep, R"({"bar":2})"));
  EXPECT_FALSE(full_match(dep, R"({"baz":1, "bar":2})"));
  // The trigger is optional: without it its dependencies are too (not required, as they were).
  EXPECT_TRUE(full_match(dep, "{}") && full_match(dep, R"({"baz":1})") && full_match(dep, R"({"foo":1})"));
  // Free-form objects take the names dependentRequired declares, and nothing else.
  auto dep_free = grammar_from_json_schema(R"({"type":"object","dependentRequired":{"bar":["foo"]}})");
  EXPECT_TRUE(full_match(dep_free, "{}") && full_match(dep_free, R"({"foo":1})") &&
              full_match(dep_free, R"({"foo":1,"bar":[2]})"));
  EXPECT_FALSE(full_match(dep_free, R"({"bar":2})") || full_match(dep_free, R"({"baz":1})"));
  // Two triggers, each with or without its dependencies (four alternatives).
  auto two = grammar_from_json_schema(R"({"type":"object","properties":{"a":{},"b":{},"c":{},"d":{}},
      "dependentRequired":{"b":["a"],"d":["c"]}})");
  EXPECT_TRUE(full_match(two, R"({"a":1,"b":2})") && full_match(two, R"({"c":1,"d":2})") &&
              full_match(two, R"({"a":1,"c":1})") && full_match(two, R"({"a":1,"b":2,"c":3,"d":4})"));
  EXPECT_FALSE(full_match(two, R"({"b":2,"c":3,"d":4})") || full_match(two, R"({"a":1,"b":2,"d":4})"));
  // A chain: b needs a, a needs c; never a combination with b but without a.
  auto chain = grammar_from_json_schema(R"({"type":"object","properties":{"a":{},"b":{},"c":{}},
      "dependentRequired":{"b":["a"],"a":["c"]},"maxProperties":2})");
  EXPECT_TRUE(full_match(chain, R"({"a":1,"c":2})") && full_match(chain, R"({"c":2})") && full_match(chain, "{}"));
  EXPECT_FALSE(full_match(chain, R"({"b":1})") || full_match(chain, R"({"a":1,"b":2})") || full_match(chain, R"({"a":1})"));
  // propertyNames constrains the undeclared keys; false allows none.
  auto names = grammar_from_json_schema(R"({"type":"object","propertyNames":{"maxLength":3}})");
  EXPECT_TRUE(full_match(names, R"({"abc":1})"));
  EXPECT_FALSE(full_match(names, R"({"abcd":1})"));
  EXPECT_TRUE(full_match(grammar_from_json_schema(R"({"type":"object","propertyNames":false})"), "{}"));
}

TEST(GrammarJsonSchema, ArraysAndOneOf) {
  // oneOf beside a branch that is one bound: the other branch takes the values past it (the
  // integers below 2 here; numbers of neither branch's own, 2.5, are not written).
  auto bound = grammar_from_json_schema(R"({"oneOf":[{"type":"integer"},{"minimum":2}]})");
  EXPECT_TRUE(full_match(bound, "1") && full_match(bound, "-5") && full_match(bound, R"("x")"));
  EXPECT_FALSE(full_match(bound, "2") || full_match(bound, "3") || full_match(bound, "1.5"));
  auto apart = grammar_from_json_schema(R"({"oneOf":[{"type":"number","maximum":0},{"type":"integer","exclusiveMinimum":0}]})");
  EXPECT_TRUE(full_match(apart, "-1.5") && full_match(apart, "0") && full_match(apart, "7"));
  EXPECT_FALSE(full_match(apart, "0.5"));
  auto g = grammar_from_json_schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
      "items":{"type":"boolean"},"maxItems":3})");
  EXPECT_TRUE(full_match(g, R"(["a",1,true])"));
  EXPECT_TRUE(full_match(g, R"(["a"])"));
  EXPECT_FALSE(full_match(g, R"(["a",1,2])"));
  auto c = grammar_from_json_schema(R"({"type":"array","items":{"type":"integer"},"contains":{"minimum":10}})");
  EXPECT_TRUE(full_match(c, R"([12,1])"));
  EXPECT_TRUE(full_match(c, R"([1, 2, 12, 3])"));  // the matching item anywhere
  EXPECT_FALSE(full_match(c, R"([])"));
  EXPECT_FALSE(full_match(c, R"([1, 2, 3])"));
  EXPECT_FALSE(full_match(c, R"([1, "x", 12])"));  // items still apply to every item
  auto two = grammar_from_json_schema(R"({"type":"array","contains":{"const":1},"minContains":2})");
  EXPECT_TRUE(full_match(two, R"([1, 2, 1])"));
  EXPECT_TRUE(full_match(two, R"([2, 1, 3, 1, 1])"));
  EXPECT_FALSE(full_match(two, R"([2, 1, 3])"));
  auto one = grammar_from_json_schema(R"({"oneOf":[{"type":["string","null"]},{"type":["number","null"]}]})");
  EXPECT_TRUE(full_match(one, R"("s")") && full_match(one, "1.5"));
  EXPECT_FALSE(full_match(one, "null"));  // valid under both branches, so not under oneOf
  // uniqueItems over general items: a grammar cannot keep arbitrary values distinct, so it is
  // refused (naming the keyword and path); best effort leaves it unenforced, with a warning.
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"},"uniqueItems":true}}})")
                .find("unsupported keyword 'uniqueItems' at #/properties/tags"),
            std::string::npos);
  SchemaReport best;
  auto uniq = grammar_from_json_schema(R"({"type":"array","items":{"type":"string"},"uniqueItems":true})", {true}, &best);
  ASSERT_EQ(best.warnings.size(), 1u);
  EXPECT_NE(best.warnings[0].find("uniqueItems"), std::string::npos);
  EXPECT_TRUE(full_match(uniq, R"(["a", "b", "c"])"));
  // Prefix items of a few constants each: the distinct tuples exactly.
  auto pair = grammar_from_json_schema(
      R"({"type":"array","prefixItems":[{"type":"boolean"},{"enum":[true,"x"]}],"items":false,"uniqueItems":true})");
  for (const char* ok : {"[]", "[true]", "[false, true]", R"([true, "x"])", R"([false,"x"])"})
    EXPECT_TRUE(full_match(pair, ok)) << ok;
  for (const char* bad : {"[true, true]", R"(["x"])", R"([true, "x", false])"}) EXPECT_FALSE(full_match(pair, bad)) << bad;
  EXPECT_NE(schema_error(R"({"type":"array","prefixItems":[{"const":1},{"const":1}],"minItems":2,"uniqueItems":true})")
                .find("'uniqueItems'"),
            std::string::npos);  // no array meets it
  EXPECT_NE(schema_error(R"({"type":"array","prefixItems":[{"const":1}],"uniqueItems":true})").find("'uniqueItems'"),
            std::string::npos);  // general items after the prefix
  // Items from a few constants: any distinct ones, in any order, within minItems/maxItems.
  auto tags = grammar_from_json_schema(
      R"({"type":"array","items":{"enum":["a","b","c",1]},"uniqueItems":true,"maxItems":3})");
  for (const char* ok : {"[]", R"(["c", "a"])", R"([1, "b", "a"])", R"(["a",1.0])"}) EXPECT_TRUE(full_match(tags, ok)) << ok;
  for (const char* bad : {R"(["a", "a"])", R"(["a", "b", "c", 1])", R"(["d"])", R"([1, 1.0])"})
    EXPECT_FALSE(full_match(tags, bad)) << bad;
  auto flags = grammar_from_json_schema(R"({"type":"array","items":{"type":"boolean"},"uniqueItems":true,"minItems":2})");
  EXPECT_TRUE(full_match(flags, "[false, true]") && full_match(flags, "[true, false]"));
  EXPECT_FALSE(full_match(flags, "[true]") || full_match(flags, "[true, true]"));
}

}  // namespace
}  // namespace fathom::grammar
