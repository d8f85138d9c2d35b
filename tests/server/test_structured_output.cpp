// The request fields that ask for structured output, and reading tool_choice "required" output
// back as calls (tests/server/test_structured_output.py runs them through a server).
#include <gtest/gtest.h>

#include "server/protocol.h"
#include "server/structured_output.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
using grammar::GrammarKind;

TEST(StructuredOutput, FieldsGiveTheirGrammar) {
  EXPECT_FALSE(structured_output_request(json::parse(R"({"response_format": {"type": "text"}})")));
  auto so = structured_output_request(json::parse(
      R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}, "strict": true}}})"));
  ASSERT_TRUE(so);
  EXPECT_EQ(so->spec.kind, GrammarKind::JsonSchema);
  EXPECT_EQ(json::parse(so->spec.text), json::parse(R"({"type": "integer"})"));
  so = structured_output_request(json::parse(R"({"structured_outputs": {"choice": ["a", "b"]}})"));
  ASSERT_TRUE(so);
  EXPECT_EQ(so->spec.kind, GrammarKind::Choice);
  EXPECT_EQ(so->spec.choices, (std::vector<std::string>{"a", "b"}));
  so = structured_output_request(json::parse(R"({"guided_json": "{\"type\": \"string\"}"})"));
  ASSERT_TRUE(so);
  EXPECT_EQ(so->field, "guided_json");
  EXPECT_EQ(structured_output_request(json::parse(R"({"guided_regex": "a+"})"))->spec.kind, GrammarKind::Regex);
  EXPECT_EQ(structured_output_request(json::parse(R"({"structured_outputs": {"grammar": "root ::= \"x\""}})"))->spec.kind,
            GrammarKind::Gbnf);
  // vLLM's per-request disable_additional_properties reaches the schema compiler's option.
  so = structured_output_request(json::parse(R"({"structured_outputs": {"json": {"type": "object"}, "disable_additional_properties": true}})"));
  ASSERT_TRUE(so);
  EXPECT_TRUE(so->disable_additional_properties);
  so = structured_output_request(json::parse(R"({"structured_outputs": {"json": {"type": "object"}}})"));
  EXPECT_FALSE(so->disable_additional_properties);
}

TEST(StructuredOutput, MalformedAndConflictingFieldsAreNamed) {
  auto param_of = [](const char* body) {
    try {
      structured_output_request(json::parse(body));
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return std::string("no error");
  };
  EXPECT_EQ(param_of(R"({"response_format": {"type": "json_schema"}})"), "response_format");
  EXPECT_EQ(param_of(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "x": 1}}})"),
            "response_format");
  EXPECT_EQ(param_of(R"({"structured_outputs": {"yaml": "x"}})"), "structured_outputs.yaml");
  EXPECT_EQ(param_of(R"({"guided_choice": []})"), "guided_choice");
  EXPECT_EQ(param_of(R"({"guided_regex": "a", "response_format": {"type": "json_object"}})"), "guided_regex");
  EXPECT_EQ(param_of(R"({"structured_outputs": {"regex": "a", "disable_additional_properties": true}})"),
            "structured_outputs.disable_additional_properties");  // a regex has no objects
  EXPECT_EQ(param_of(R"({"structured_outputs": {"json": {}, "disable_additional_properties": 1}})"),
            "structured_outputs.disable_additional_properties");
}

TEST(StructuredOutput, RequiredCallsAreReadAsWritten) {
  const auto calls = split_forced_calls(
      R"([{"name": "add", "parameters": {"a": 1e99999, "b": [1, "]}"]}}, {"name":"f","parameters":{}}])");
  ASSERT_TRUE(calls);
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "add");
  EXPECT_EQ((*calls)[0].arguments, R"({"a": 1e99999, "b": [1, "]}"]})");  // not re-serialized
  EXPECT_EQ((*calls)[1].arguments, "{}");
  EXPECT_FALSE(split_forced_calls(R"([{"name": "add", "parameters": {"a": 1)"));  // cut by max_tokens
  EXPECT_FALSE(split_forced_calls(R"([])"));
  EXPECT_FALSE(split_forced_calls(R"({"name": "add"})"));
}

TEST(StructuredOutput, RequiredCallsCutByMaxTokensKeepTheCompleteOnes) {
  const std::string text = R"([{"name": "add", "parameters": {"a": 1}}, {"name": "f", "parameters": {"x": [1, 2)";
  bool cut = false;
  const auto calls = split_forced_calls(text, /*allow_cut=*/true, &cut);
  ASSERT_TRUE(calls);
  EXPECT_TRUE(cut);
  ASSERT_EQ(calls->size(), 1u);  // the cut call is dropped
  EXPECT_EQ((*calls)[0].name, "add");
  EXPECT_EQ((*calls)[0].arguments, R"({"a": 1})");
  EXPECT_FALSE(split_forced_calls(text));  // without allow_cut: not a list of calls
  cut = false;
  const auto none = split_forced_calls(R"([{"name": "add", "parameters": {"a)", true, &cut);  // none complete
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(cut);
  cut = false;
  const auto whole = split_forced_calls(R"([{"name": "add", "parameters": {}}])", true, &cut);
  ASSERT_TRUE(whole);
  EXPECT_FALSE(cut);
}

TEST(StructuredOutput, ForcedToolCallSchemas) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                                     {"type": "function", "function": {"name": "g"}}])");
  const json one = json::parse(forced_tool_call_request(tools, "g").spec.text);
  EXPECT_EQ(one, json::parse(R"({"type": "object", "properties": {}})"));  // no parameters: {} only
  const json list = json::parse(forced_tool_call_request(tools, "", /*parallel=*/false).spec.text);
  EXPECT_EQ(list["maxItems"], 1);
  EXPECT_EQ(list["items"]["anyOf"].size(), 2u);
  EXPECT_THROW(forced_tool_call_request(tools, "h"), ApiError);
}

}  // namespace
}  // namespace fathom::server
