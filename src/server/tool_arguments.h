// Tool-call arguments of the qwen3_coder format: each parameter's value is text, turned into
// JSON by the type that the request's tool schema gives it (as vLLM's qwen3_coder parser does).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fathom::server {

// How a parameter's text becomes JSON.
enum class ParamKind {
  kString,   // verbatim ("string", "str", "text", "enum", ...)
  kInteger,  // a JSON number, else the text
  kNumber,
  kBoolean,  // true / false in any case (Jinja prints Python's True / False), else the text
  kNull,
  kJson,     // object / array: parsed as JSON, else the text
  kUnknown,  // no schema or no type: JSON if it parses, else the text
};

// The schema of parameter `param` of function `function` in an OpenAI `tools` list
// ([{"type": "function", "function": {"name", "parameters": {"properties": ...}}}]), or null.
const nlohmann::ordered_json* find_parameter_schema(const nlohmann::ordered_json& tools, std::string_view function,
                                                    std::string_view param);

ParamKind parameter_kind(const nlohmann::ordered_json* schema);

// The JSON value of a parameter's text. Never throws: text that does not fit the type stays a
// string. Outside kString, "null" is null.
nlohmann::ordered_json convert_parameter(std::string_view text, ParamKind kind);

// `value` as JSON text, compact; strings escaped byte by byte (append_json_escaped) so that a
// string streamed in pieces serializes to the same bytes.
std::string dump_argument(const nlohmann::ordered_json& value);

}  // namespace fathom::server
