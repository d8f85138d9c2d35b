// Tree-walking evaluator: renders a parsed template against a context of variables with
// jinja2 semantics (scoping of for/macro/set, Undefined, loop variables, break/continue).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "chat/value.h"

namespace fathom::chat {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  explicit Interpreter(const SourceMap& map) : map_(map) {}

  // Renders body with `globals` (a Dict value) as the outermost scope.
  std::string render(const std::vector<NodePtr>& body, const Value& globals);

  Value eval(const NodePtr& n, const ScopePtr& s);
  Value call(const Value& callee, CallArgs& args);
  [[noreturn]] void fail_at(size_t offset, const std::string& msg) const;

 private:
  enum class Flow { Normal, Break, Continue };
  const SourceMap& map_;

  Flow exec(const std::vector<NodePtr>& body, const ScopePtr& s, std::string& out);
  Flow exec_node(const NodePtr& n, const ScopePtr& s, std::string& out);
  Flow exec_for(const NodePtr& n, const ScopePtr& s, std::string& out);
  void assign(const NodePtr& target, const Value& v, const ScopePtr& s);
  Value eval_impl(const NodePtr& n, const ScopePtr& s);
  Value apply_filters(const NodePtr& chain, const Value& input, const ScopePtr& s);
  CallArgs eval_args(const NodePtr& n, const ScopePtr& s);
  Value make_macro(const NodePtr& n, const ScopePtr& s, const std::string& name);
  Value lookup(const std::string& name, const ScopePtr& s) const;
};

// Python-level operations shared by the evaluator and the builtins.
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
std::vector<Value> iterate(const Value& v);
[[noreturn]] void undefined_fail(const Value& u);

}  // namespace fathom::chat
