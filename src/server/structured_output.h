// Structured output: the grammar a request asks its output to follow, from OpenAI's
// response_format (json_object, json_schema) and vLLM's structured_outputs {json, regex, choice,
// grammar, json_object} and older guided_json / guided_regex / guided_choice / guided_grammar.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "grammar/compiler.h"

namespace fathom::server {

struct StructuredOutputRequest {
  grammar::GrammarSpec spec;
  std::string field;  // the request field it came from (named by errors)
  // structured_outputs.disable_additional_properties (vLLM): no undeclared keys in any object.
  bool disable_additional_properties = false;
};

// The constraint in `body`, or nullopt when there is none ("response_format": {"type": "text"}).
// Throws ApiError (400) for malformed fields or more than one constraint.
std::optional<StructuredOutputRequest> structured_output_request(const nlohmann::ordered_json& body);

// tool_choice "required" (named empty): a JSON list of one or more {"name": ..., "parameters":
// {...}} objects, each name one of `tools` with its parameters' schema; a named function: that
// function's parameters object. As vLLM enforces them. Throws ApiError for an unknown name.
StructuredOutputRequest forced_tool_call_request(const nlohmann::ordered_json& tools, const std::string& named,
                                                bool parallel = true);  // false: one call at most

struct ForcedCall {
  std::string name, arguments;  // arguments: the "parameters" object's text as generated
};
// The calls in a tool_choice "required" output (a JSON list of {"name", "parameters"} objects),
// read without re-serializing: numbers stay as written (a JSON number may not fit a double).
// nullopt when the text is not such a list. allow_cut: a list cut short (by max_tokens) gives its
// complete calls (the cut one dropped; none when the first call was cut), and *cut is set.
std::optional<std::vector<ForcedCall>> split_forced_calls(std::string_view text, bool allow_cut = false,
                                                          bool* cut = nullptr);

}  // namespace fathom::server
