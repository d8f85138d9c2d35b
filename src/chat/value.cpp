#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/text.h"

namespace fathom::chat {

void runtime_fail(std::string message) { throw RuntimeFailure{std::move(message)}; }

Value Value::undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.i = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind = Kind::Float;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(s);
  return v;
}
Value Value::new_list(std::vector<Value> items, bool is_tuple) {
  Value v;
  v.kind = Kind::List;
  v.tuple = is_tuple;
  v.list = std::make_shared<ListData>();
  v.list->items = std::move(items);
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::new_namespace() {
  Value v = new_dict();
  v.kind = Kind::Namespace;
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return none();
    case T::boolean: return boolean(j.get<bool>());
    case T::number_integer: return integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return integer(static_cast<int64_t>(u));
      return number(static_cast<double>(u));
    }
    case T::number_float: return number(j.get<double>());
    case T::string: return string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return new_list(std::move(items));
    }
    case T::object: {
      Value d = new_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json(it.value()));
      return d;
    }
    default: return none();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->items.empty();
    case Kind::Dict: return !dict->items.empty();
    default: return true;
  }
}

double Value::as_double() const {
  switch (kind) {
    case Kind::Bool: return b ? 1.0 : 0.0;
    case Kind::Int: return static_cast<double>(i);
    case Kind::Float: return f;
    default: runtime_fail("expected a number, got " + type_name());
  }
}

std::string Value::type_name() const {
  switch (kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

const Value* DictData::find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void DictData::set(const std::string& key, Value v) {
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(v);
  } else {
    index.emplace(key, items.size());
    items.emplace_back(key, std::move(v));
  }
}

const Value* CallArgs::get(size_t pos, const char* name) const {
  if (name)
    for (const auto& kv : kwargs)
      if (kv.first == name) return &kv.second;
  if (pos < args.size()) return &args[pos];
  return nullptr;
}

Value CallArgs::get_or(size_t pos, const char* name, Value fallback) const {
  const Value* v = get(pos, name);
  return v ? *v : fallback;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python switches to exponent notation outside this range
    if (exp < 0) {
      out += "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + eb;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_isprintable(c)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return repr_string(v.s);
    case Value::Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.list->items[k]);
      }
      if (v.tuple && v.list->items.size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(val);
      }
      return out + "}";
    }
    case Value::Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + repr(val);
      }
      return out + "}>";
    }
    case Value::Kind::Undefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::Callable: return "<function " + v.fn->name + ">";
    default: return repr(v);
  }
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 | (v >> 10)),
                          static_cast<unsigned>(0xdc00 | (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8_append(out, c);
        }
      }
    }
  }
  out.push_back('"');
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int k = 0; k < lvl; ++k) out += opt.indent;
  };
  switch (v.kind) {
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::String: json_string(out, v.s, opt.ensure_ascii); return;
    case Value::Kind::List: {
      if (v.list->items.empty()) { out += "[]"; return; }
      out.push_back('[');
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_value(out, v.list->items[k], opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.has_indent) newline(level + 1);
        json_string(out, items[k]->first, opt.ensure_ascii);
        out += opt.key_sep;
        json_value(out, items[k]->second, opt, level + 1);
      }
      if (opt.has_indent) newline(level);
      out.push_back('}');
      return;
    }
    default: runtime_fail("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0);
  return out;
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::Float && b.kind != K::Float) {
      int64_t x = a.kind == K::Bool ? a.b : a.i, y = b.kind == K::Bool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.s == b.s;
    case K::List: {
      if (a.tuple != b.tuple || a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!equals(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case K::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case K::Namespace: return a.dict == b.dict;
    case K::Callable: return a.fn == b.fn;
    default: return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float) {
      int64_t x = a.kind == Value::Kind::Bool ? a.b : a.i, y = b.kind == Value::Kind::Bool ? b.b : b.i;
      return x < y;
    }
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order == code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list->items, &y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equals(x[k], y[k])) return less_than(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  runtime_fail("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

}  // namespace fathom::chat
