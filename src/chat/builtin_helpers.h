// Helpers shared by the builtin filters, tests, methods and globals (builtin_*.cpp); internal to
// src/chat.
#pragma once
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "chat/interpreter.h"
#include "chat/text.h"
#include "chat/value.h"

namespace fathom::chat::builtin {

using K = Value::Kind;

inline bool is_int(const Value& v) { return v.kind == K::Int || v.kind == K::Bool; }
inline int64_t to_int(const Value& v) { return v.kind == K::Bool ? v.b : v.i; }

inline int64_t length_of(const Value& v) {
  switch (v.kind) {
    case K::Undefined: return 0;
    case K::String: return static_cast<int64_t>(utf8_length(v.s));
    case K::List: return static_cast<int64_t>(v.list->items.size());
    case K::Dict: return static_cast<int64_t>(v.dict->items.size());
    default: runtime_fail("object of type '" + v.type_name() + "' has no len()");
  }
}

inline const Value& arg(CallArgs& a, size_t pos, const char* name, const Value& fallback) {
  const Value* v = a.get(pos, name);
  return v ? *v : fallback;
}
inline const Value kNone = Value::none();
inline const Value kFalse = Value::boolean(false);

inline std::string need_str(const Value& v, const char* what) {
  if (v.is_undefined()) undefined_fail(v);
  if (!v.is_string()) runtime_fail(std::string(what) + " must be str, not " + v.type_name());
  return v.s;
}

// jinja2's make_attrgetter: dotted path, integer parts index sequences.
inline Value attr_path(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = digits ? get_item(cur, Value::integer(std::stoll(part))) : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

inline Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.s));
  return v;
}

inline std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

inline std::vector<std::string> split_lines(const std::string& s, bool keepends) {
  std::vector<std::string> lines;
  std::u32string u = utf8_decode(s);
  std::u32string curl;
  for (size_t k = 0; k < u.size(); ++k) {
    char32_t c = u[k];
    bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
               c == 0x2028 || c == 0x2029;
    if (!brk) {
      curl.push_back(c);
      continue;
    }
    if (keepends) curl.push_back(c);
    if (c == '\r' && k + 1 < u.size() && u[k + 1] == '\n') {
      if (keepends) curl.push_back('\n');
      ++k;
    }
    lines.push_back(utf8_encode(curl));
    curl.clear();
  }
  if (!curl.empty()) lines.push_back(utf8_encode(curl));
  return lines;
}

}  // namespace fathom::chat::builtin
