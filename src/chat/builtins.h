// jinja2 builtin filters and tests, Python str/dict/list methods, and the globals that
// transformers installs (raise_exception, strftime_now) plus jinja2's (namespace, range, dict),
// defined in builtin_filters.cpp, builtin_tests.cpp, builtin_methods.cpp and builtin_globals.cpp.
#pragma once
#include <string>

#include "chat/value.h"

namespace fathom::chat {

using FilterFn = Value (*)(Interpreter&, const Value& input, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& v, CallArgs& args);

FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// A bound method of a str/dict/list (Python getattr), or Undefined if there is none.
Value get_method(const Value& obj, const std::string& name);
// Adds the template globals to a Dict value.
void install_globals(Value& globals);

}  // namespace fathom::chat
