#include "server/tool_arguments.h"

#include <algorithm>
#include <cctype>

#include "server/stream_text.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

namespace {

constexpr int kMaxValueDepth = 64;  // deeper JSON stays text: dump() recurses

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

ParamKind kind_of_name(std::string_view type) {
  const std::string t = lower(trim(type));
  for (const char* s : {"string", "str", "text", "varchar", "char", "enum"})
    if (t == s) return ParamKind::kString;
  for (const char* p : {"int", "uint", "long", "short", "unsigned"})
    if (starts_with(t, p)) return ParamKind::kInteger;
  for (const char* p : {"num", "float", "double"})
    if (starts_with(t, p)) return ParamKind::kNumber;
  if (t == "boolean" || t == "bool" || t == "binary") return ParamKind::kBoolean;
  if (t == "null") return ParamKind::kNull;
  if (t == "object" || t == "array" || t == "arr" || starts_with(t, "dict") || starts_with(t, "list"))
    return ParamKind::kJson;
  return ParamKind::kUnknown;
}

bool nesting_within_limit(std::string_view text) {
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxValueDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

// The parsed JSON, or discarded.
json try_json(std::string_view text) {
  if (text.empty() || !nesting_within_limit(text)) return json(json::value_t::discarded);
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace

const json* find_parameter_schema(const json& tools, std::string_view function, std::string_view param) {
  if (!tools.is_array()) return nullptr;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const json& fn = tool.contains("function") ? tool["function"] : tool;  // also the bare {name, parameters}
    if (!fn.is_object()) continue;
    auto name = fn.find("name");
    if (name == fn.end() || !name->is_string() || name->get_ref<const std::string&>() != function) continue;
    auto params = fn.find("parameters");
    if (params == fn.end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    auto p = props->find(std::string(param));
    return p == props->end() ? nullptr : &*p;
  }
  return nullptr;
}

ParamKind parameter_kind(const json* schema) {
  if (!schema || !schema->is_object()) return ParamKind::kUnknown;
  auto type = schema->find("type");
  if (type == schema->end()) return ParamKind::kUnknown;
  if (type->is_string()) return kind_of_name(type->get_ref<const std::string&>());
  if (!type->is_array()) return ParamKind::kUnknown;
  // A union such as ["integer", "null"]: a string member wins (the text is then kept as it is),
  // else the first member that is not "null".
  ParamKind first = ParamKind::kNull;
  bool have_first = false;
  for (const auto& t : *type) {
    if (!t.is_string()) continue;
    ParamKind k = kind_of_name(t.get_ref<const std::string&>());
    if (k == ParamKind::kString) return k;
    if (k != ParamKind::kNull && !have_first) first = k, have_first = true;
  }
  return first;
}

json convert_parameter(std::string_view text, ParamKind kind) {
  if (kind == ParamKind::kString) return json(std::string(text));
  const std::string_view t = trim(text);
  const std::string low = lower(t);
  if (low == "null") return nullptr;
  switch (kind) {
    case ParamKind::kInteger:
    case ParamKind::kNumber: {
      json v = try_json(t);
      if (v.is_number()) return v;
      break;
    }
    case ParamKind::kBoolean:
      if (low == "true") return true;
      if (low == "false") return false;
      break;
    case ParamKind::kNull:
      if (low == "none") return nullptr;  // Python's None as Jinja prints it
      [[fallthrough]];
    default: {
      json v = try_json(t);
      if (!v.is_discarded()) return v;
    }
  }
  return json(std::string(text));
}

std::string dump_argument(const json& value) {
  if (!value.is_string()) return value.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out = "\"";
  append_json_escaped(out, value.get_ref<const std::string&>());
  out += '"';
  return out;
}

}  // namespace fathom::server
