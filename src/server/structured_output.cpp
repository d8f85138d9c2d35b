#include "server/structured_output.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "server/protocol.h"
#include "server/request_parser.h"

namespace fathom::server {

using json = nlohmann::ordered_json;
using grammar::GrammarKind;
using grammar::GrammarSpec;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError{400, msg, param, "invalid_value"}; }

// A schema given as an object or as JSON text (vLLM accepts both); text is parsed with the
// request's nesting limit before the grammar compiler walks it.
std::string schema_text(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    try {
      return parse_json_limited(v.get<std::string>(), ("'" + field + "'").c_str()).dump();
    } catch (const ApiError& e) {
      bad(field, e.message);
    }
  }
  bad(field, "'" + field + "' must be a JSON schema (an object or its JSON text)");
}

// Regex and GBNF front-ends parse by recursive descent: hostile nesting is refused first (an
// over-count inside quotes or classes only refuses absurd inputs).
void check_nesting(const std::string& text, const std::string& field) {
  int depth = 0, deepest = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\') ++i;
    else if (text[i] == '(') deepest = std::max(deepest, ++depth);
    else if (text[i] == ')') --depth;
  }
  if (deepest > kMaxJsonDepth)
    bad(field, "'" + field + "' nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

std::string string_of(const json& v, const std::string& field) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(field, "'" + field + "' must be a non-empty string");
  check_nesting(v.get<std::string>(), field);
  return v.get<std::string>();
}

std::vector<std::string> choices_of(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty()) bad(field, "'" + field + "' must be a non-empty list of strings");
  std::vector<std::string> out;
  for (const json& c : v) {
    if (!c.is_string()) bad(field, "'" + field + "' must be a list of strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::optional<GrammarSpec> from_response_format(const json& rf) {
  if (!rf.is_object()) bad("response_format", "'response_format' must be an object");
  const auto t = rf.find("type");
  if (t == rf.end() || !t->is_string()) bad("response_format", "'response_format' needs a string 'type'");
  if (*t == "text") return std::nullopt;
  if (*t == "json_object") return GrammarSpec{GrammarKind::JsonObject, "", {}};
  if (*t == "json_schema") {
    const auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object())
      bad("response_format", "'response_format' of type \"json_schema\" needs a 'json_schema' object");
    for (const auto& [k, v] : js->items())
      if (k != "name" && k != "schema" && k != "strict" && k != "description")
        bad("response_format", "'response_format.json_schema." + k + "' is not supported");
    const auto schema = js->find("schema");
    if (schema == js->end()) bad("response_format", "'response_format.json_schema' needs a 'schema'");
    return GrammarSpec{GrammarKind::JsonSchema, schema_text(*schema, "response_format.json_schema.schema"), {}};
  }
  bad("response_format", "'response_format' of type " + t->dump() + " is not supported (text, json_object, json_schema)");
}

// One of vLLM's forms: key json / regex / choice / grammar / json_object.
std::optional<GrammarSpec> from_key(const std::string& key, const json& v, const std::string& field) {
  if (key == "json") return GrammarSpec{GrammarKind::JsonSchema, schema_text(v, field), {}};
  if (key == "regex") return GrammarSpec{GrammarKind::Regex, string_of(v, field), {}};
  if (key == "choice") return GrammarSpec{GrammarKind::Choice, "", choices_of(v, field)};
  if (key == "grammar") return GrammarSpec{GrammarKind::Gbnf, string_of(v, field), {}};
  if (key == "json_object") {
    if (!v.is_boolean()) bad(field, "'" + field + "' must be a boolean");
    return v.get<bool>() ? std::optional<GrammarSpec>(GrammarSpec{GrammarKind::JsonObject, "", {}}) : std::nullopt;
  }
  bad(field, "'" + field + "' is not supported (json, regex, choice, grammar, json_object)");
}

}  // namespace

std::optional<StructuredOutputRequest> structured_output_request(const json& body) {
  static constexpr const char* kClosedField = "structured_outputs.disable_additional_properties";
  std::vector<StructuredOutputRequest> found;
  std::optional<bool> closed;
  auto add = [&](std::optional<GrammarSpec> s, const std::string& field) {
    if (s) found.push_back({std::move(*s), field});
  };
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null())
    add(from_response_format(*it), "response_format");
  if (auto it = body.find("structured_outputs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [k, v] : it->items())
      if (!v.is_null() && k != "disable_additional_properties")
        add(from_key(k, v, "structured_outputs." + k), "structured_outputs");
    // vLLM's per-request switch: objects without additionalProperties take only declared keys.
    if (auto d = it->find("disable_additional_properties"); d != it->end() && !d->is_null()) {
      if (!d->is_boolean()) bad(kClosedField, std::string("'") + kClosedField + "' must be a boolean");
      closed = d->get<bool>();
    }
  }
  for (const char* key : {"json", "regex", "choice", "grammar"}) {
    const std::string field = std::string("guided_") + key;
    if (auto it = body.find(field); it != body.end() && !it->is_null()) add(from_key(key, *it, field), field);
  }
  if (found.size() > 1)
    bad(found[1].field, "only one structured-output constraint a request (got " + found[0].field + " and " +
                            found[1].field + ")");
  if (closed && (found.empty() || found.front().spec.kind != GrammarKind::JsonSchema))
    bad(kClosedField, std::string("'") + kClosedField + "' applies to a JSON schema only");
  if (found.empty()) return std::nullopt;
  found.front().disable_additional_properties = closed.value_or(false);
  return found.front();
}

namespace {

// A raw JSON scanner over generated text: skips one value starting at i (strings with escapes,
// nested containers), returning the index past it, or npos when the text ends first.
size_t skip_value(std::string_view s, size_t i) {
  int depth = 0;
  bool in_string = false;
  for (; i < s.size(); ++i) {
    const char ch = s[i];
    if (in_string) {
      if (ch == '\\') ++i;
      else if (ch == '"') {
        in_string = false;
        if (depth == 0) return i + 1;
      }
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') ++depth;
    else if (ch == '}' || ch == ']') {
      if (--depth == 0) return i + 1;
      if (depth < 0) return std::string_view::npos;
    } else if (depth == 0 && (ch == ',' || ch == ' ')) {
      return i;  // the end of a bare number / literal
    }
  }
  return depth == 0 && !in_string ? s.size() : std::string_view::npos;
}

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

std::optional<std::vector<ForcedCall>> split_forced_calls(std::string_view s, bool allow_cut, bool* cut) {
  std::vector<ForcedCall> calls;
  // The complete calls of a list cut short (none when the first was cut), or not a list of
  // calls at all.
  auto broken = [&]() -> std::optional<std::vector<ForcedCall>> {
    if (!allow_cut) return std::nullopt;
    if (cut) *cut = true;
    return calls;
  };
  size_t i = skip_space(s, 0);
  if (i >= s.size() || s[i] != '[') return std::nullopt;
  for (i = skip_space(s, i + 1); i < s.size() && s[i] != ']';) {
    if (s[i] != '{') return broken();
    ForcedCall call;
    for (i = skip_space(s, i + 1); i < s.size() && s[i] != '}';) {
      const size_t key_end = skip_value(s, i);
      if (s[i] != '"' || key_end == std::string_view::npos) return broken();
      const json key = json::parse(s.substr(i, key_end - i), nullptr, false);
      i = skip_space(s, key_end);
      if (i >= s.size() || s[i] != ':') return broken();
      i = skip_space(s, i + 1);
      const size_t value_end = skip_value(s, i);
      if (value_end == std::string_view::npos) return broken();
      const std::string_view value = s.substr(i, value_end - i);
      if (key == "name") {
        const json name = json::parse(value, nullptr, false);
        if (!name.is_string()) return broken();
        call.name = name.get<std::string>();
      } else if (key == "parameters") {
        call.arguments = std::string(value);
      }
      i = skip_space(s, value_end);
      if (i < s.size() && s[i] == ',') i = skip_space(s, i + 1);
    }
    if (i >= s.size() || call.name.empty()) return broken();
    if (call.arguments.empty()) call.arguments = "{}";
    calls.push_back(std::move(call));
    i = skip_space(s, i + 1);
    if (i < s.size() && s[i] == ',') i = skip_space(s, i + 1);
  }
  if (i >= s.size()) return broken();
  if (calls.empty()) return std::nullopt;
  return calls;
}

StructuredOutputRequest forced_tool_call_request(const json& tools, const std::string& named, bool parallel) {
  // A function without parameters takes none: {} (an empty "properties" closes the object).
  auto parameters = [](const json& fn) {
    const auto p = fn.find("parameters");
    return p != fn.end() && p->is_object() ? *p : json{{"type", "object"}, {"properties", json::object()}};
  };
  json alternatives = json::array();
  for (const json& t : tools) {
    const json fn = t.value("function", json::object());
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      bad("tools", "each tool needs a 'function' with a string 'name'");
    const std::string name = fn["name"].get<std::string>();
    if (!named.empty()) {
      if (name == named) return {GrammarSpec{GrammarKind::JsonSchema, parameters(fn).dump(), {}}, "tool_choice"};
      continue;
    }
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"const", name}}}, {"parameters", parameters(fn)}}},
                            {"required", {"name", "parameters"}},
                            {"additionalProperties", false}});
  }
  if (!named.empty()) bad("tool_choice", "'tool_choice' names '" + named + "', which is not among 'tools'");
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", alternatives}}}};
  if (!parallel) schema["maxItems"] = 1;
  return {GrammarSpec{GrammarKind::JsonSchema, schema.dump(), {}}, "tool_choice"};
}

}  // namespace fathom::server
