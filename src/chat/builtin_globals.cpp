// Template globals: transformers' raise_exception and strftime_now, jinja2's namespace, dict and
// range.
#include <ctime>

#include "chat/builtin_helpers.h"
#include "chat/builtins.h"
#include "chat/interpreter.h"
#include "chat/text.h"

namespace fathom::chat {

using namespace builtin;

void install_globals(Value& g) {
  g.dict->set("raise_exception", Value::callable("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
                runtime_fail(a.args.empty() ? std::string() : to_str(a.args[0]));
              }));
  g.dict->set("strftime_now", Value::callable("strftime_now", [](Interpreter&, CallArgs& a) -> Value {
                std::string fmt = a.args.empty() ? "" : to_str(a.args[0]);
                std::time_t t = std::time(nullptr);
                std::tm tm{};
                localtime_r(&t, &tm);
                char buf[512];
                size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                return Value::string(std::string(buf, n));
              }));
  g.dict->set("namespace", Value::callable("namespace", [](Interpreter&, CallArgs& a) -> Value {
                Value ns = Value::new_namespace();
                for (const auto& p : a.args) {
                  if (p.kind != K::Dict) runtime_fail("namespace() positional argument must be a mapping");
                  for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
                }
                for (const auto& [k, v] : a.kwargs) ns.dict->set(k, v);
                return ns;
              }));
  g.dict->set("dict", Value::callable("dict", [](Interpreter&, CallArgs& a) -> Value {
                Value d = Value::new_dict();
                for (const auto& p : a.args) {
                  if (p.kind != K::Dict) runtime_fail("dict() positional argument must be a mapping");
                  for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
                }
                for (const auto& [k, v] : a.kwargs) d.dict->set(k, v);
                return d;
              }));
  g.dict->set("range", Value::callable("range", [](Interpreter&, CallArgs& a) -> Value {
                if (a.args.empty() || a.args.size() > 3) runtime_fail("range expected 1 to 3 arguments");
                for (const auto& x : a.args)
                  if (!is_int(x)) runtime_fail("'" + x.type_name() + "' object cannot be interpreted as an integer");
                int64_t start = 0, stop, step = 1;
                if (a.args.size() == 1) stop = to_int(a.args[0]);
                else {
                  start = to_int(a.args[0]);
                  stop = to_int(a.args[1]);
                  if (a.args.size() == 3) step = to_int(a.args[2]);
                }
                if (step == 0) runtime_fail("range() arg 3 must not be zero");
                std::vector<Value> out;
                for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                  if (out.size() >= 100000) runtime_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
                  out.push_back(Value::integer(k));
                }
                return Value::new_list(std::move(out));
              }));
}

}  // namespace fathom::chat
