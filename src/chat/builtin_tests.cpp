// jinja2's builtin tests (`is defined`, `is string`, ...).
#include "chat/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "chat/builtin_helpers.h"
#include "chat/interpreter.h"
#include "chat/text.h"

namespace fathom::chat {
namespace {

using namespace builtin;

const Value& test_arg(CallArgs& a) {
  if (a.args.empty()) runtime_fail("test requires an argument");
  return a.args[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Int; }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Float; }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool; }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Dict; }
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == K::String || v.kind == K::List || v.kind == K::Dict || v.kind == K::Undefined;
}
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.kind == K::String || v.kind == K::List || v.kind == K::Dict || v.kind == K::Undefined;
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Callable; }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool && v.b; }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.kind == K::Bool && !v.b; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) { return contains(test_arg(a), v); }
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, test_arg(a)); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, test_arg(a)); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return less_than(v, test_arg(a)); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return less_than(test_arg(a), v); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return less_than(v, test_arg(a)) || equals(v, test_arg(a)); }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return less_than(test_arg(a), v) || equals(v, test_arg(a)); }
int64_t int_operand(const Value& v) {
  if (v.is_undefined()) undefined_fail(v);
  if (!is_int(v)) runtime_fail("expected an integer, got " + v.type_name());
  return to_int(v);
}
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return (int_operand(v) % 2 + 2) % 2 == 1; }
bool t_even(Interpreter&, const Value& v, CallArgs&) { return int_operand(v) % 2 == 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  int64_t d = int_operand(test_arg(a));
  if (d == 0) runtime_fail("integer division or modulo by zero");
  return int_operand(v) % d == 0;
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = test_arg(a);
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case K::None:
    case K::Undefined: return true;
    case K::Bool: return v.b == o.b;
    case K::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;
    case K::List: return v.list == o.list;
    case K::Dict:
    case K::Namespace: return v.dict == o.dict;
    case K::Callable: return v.fn == o.fn;
    default: return false;
  }
}
bool t_lower(Interpreter&, const Value& v, CallArgs&) { std::string s = to_str(v); return py_lower(s) == s && py_upper(s) != s; }
bool t_upper(Interpreter&, const Value& v, CallArgs&) { std::string s = to_str(v); return py_upper(s) == s && py_lower(s) != s; }
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_filter(v.s) != nullptr; }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && find_test(v.s) != nullptr; }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
      {"number", t_number}, {"integer", t_integer}, {"float", t_float}, {"boolean", t_boolean},
      {"mapping", t_mapping}, {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
      {"true", t_true}, {"false", t_false}, {"in", t_in}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq},
      {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"<", t_lt}, {"lessthan", t_lt}, {"le", t_le}, {"<=", t_le},
      {"gt", t_gt}, {">", t_gt}, {"greaterthan", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"odd", t_odd},
      {"even", t_even}, {"divisibleby", t_divisibleby}, {"sameas", t_sameas}, {"lower", t_lower},
      {"upper", t_upper}, {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return m;
}

}  // namespace

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

}  // namespace fathom::chat
