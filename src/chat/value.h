// Runtime values of the chat-template (Jinja2 subset) interpreter. They model the Python
// objects jinja2 sees: None, Undefined, bool, int, float, str, list/tuple, dict (insertion
// ordered), jinja2 namespace objects and callables (macros, builtins, bound methods).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fathom::chat {

struct Value;
struct ListData;
struct DictData;
struct CallArgs;
class Interpreter;

using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  bool tuple = false;  // a List that is a Python tuple (prints with parentheses)
  int64_t i = 0;
  double f = 0.0;
  std::string s;  // String payload, or the reason an Undefined is undefined
  std::shared_ptr<ListData> list;
  std::shared_ptr<DictData> dict;  // Dict and Namespace
  std::shared_ptr<Callable> fn;

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value new_list(std::vector<Value> items = {}, bool is_tuple = false);
  static Value new_dict();
  static Value new_namespace();
  static Value callable(std::string name, NativeFn fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool truthy() const;
  double as_double() const;
  // Python type name used in error messages ("str", "dict", "NoneType", ...).
  std::string type_name() const;
};

struct ListData {
  std::vector<Value> items;
};

struct DictData {
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t> index;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Python-style binding: positional index or keyword name; returns nullptr if absent.
  const Value* get(size_t pos, const char* name) const;
  Value get_or(size_t pos, const char* name, Value fallback) const;
};

// str(value) as Python/jinja2 prints it.
std::string to_str(const Value& v);
// repr(value) as Python prints it.
std::string repr(const Value& v);
// Python float.__repr__.
std::string float_repr(double d);
// json.dumps(value, ensure_ascii, indent, separators, sort_keys); indent "" = none.
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);
// Python ==.
bool equals(const Value& a, const Value& b);
// Python <; throws RuntimeFailure on unorderable types.
bool less_than(const Value& a, const Value& b);

// An error raised while evaluating; the interpreter adds the template position.
struct RuntimeFailure {
  std::string message;
};
[[noreturn]] void runtime_fail(std::string message);

}  // namespace fathom::chat
