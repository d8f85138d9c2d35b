// Field checks shared by the API translators (anthropic_messages.cpp, openai_responses.cpp): a
// 400 naming the field, refusing keys outside a set, typed reads that name what they expected.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "server/protocol.h"

namespace fathom::server {

[[noreturn]] inline void bad_field(const std::string& param, const std::string& msg) {
  throw ApiError{400, msg, param, "invalid_value"};
}

// Refuses any key of `obj` outside `allowed`, naming it (`where` says which object, `api` which
// endpoint's documentation lists them).
inline void only_keys(const nlohmann::ordered_json& obj, const std::set<std::string>& allowed, const std::string& where,
                      const std::string& api = "") {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (!allowed.count(it.key()))
      bad_field(it.key(), "unsupported field '" + it.key() + "' in " + where + (api.empty() ? "" : " for " + api) +
                              " (see docs/api.md)");
}

// A block's or item's "type" ("" when missing or not a string: refused by the caller as unknown).
inline std::string type_of(const nlohmann::ordered_json& obj) {
  const auto it = obj.find("type");
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

inline const nlohmann::ordered_json& object_at(const nlohmann::ordered_json& j, const std::string& where) {
  if (!j.is_object()) bad_field(where, where + " must be an object");
  return j;
}

inline std::string string_at(const nlohmann::ordered_json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) bad_field(key, where + "." + key + " must be a string");
  return it->get<std::string>();
}

}  // namespace fathom::server
