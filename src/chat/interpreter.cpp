#include "chat/interpreter.h"

#include <cmath>
#include <optional>

#include "chat/builtins.h"
#include "chat/text.h"
#include "core/error.h"

namespace fathom::chat {

void Interpreter::fail_at(size_t offset, const std::string& msg) const {
  auto [line, col] = map_.position(offset);
  fail("chat template error at line ", line, ":", col, ": ", msg);
}

void undefined_fail(const Value& u) { runtime_fail(u.s.empty() ? "value is undefined" : u.s); }

std::string Interpreter::render(const std::vector<NodePtr>& body, const Value& globals) {
  auto root = std::make_shared<Scope>();
  for (const auto& [k, v] : globals.dict->items) root->vars[k] = v;
  auto top = std::make_shared<Scope>();
  top->parent = root;
  std::string out;
  exec(body, top, out);
  return out;
}

Interpreter::Flow Interpreter::exec(const std::vector<NodePtr>& body, const ScopePtr& s, std::string& out) {
  for (const auto& n : body) {
    Flow f = exec_node(n, s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Value Interpreter::lookup(const std::string& name, const ScopePtr& s) const {
  for (Scope* sc = s.get(); sc; sc = sc->parent.get()) {
    auto it = sc->vars.find(name);
    if (it != sc->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const NodePtr& target, const Value& v, const ScopePtr& s) {
  if (target->kind == NodeKind::Name) {
    s->vars[target->name] = v;
  } else if (target->kind == NodeKind::Tuple) {
    std::vector<Value> items = iterate(v);
    if (items.size() != target->items.size())
      fail_at(target->offset, items.size() < target->items.size()
                                  ? "not enough values to unpack (expected " + std::to_string(target->items.size()) +
                                        ", got " + std::to_string(items.size()) + ")"
                                  : "too many values to unpack (expected " + std::to_string(target->items.size()) + ")");
    for (size_t k = 0; k < items.size(); ++k) assign(target->items[k], items[k], s);
  } else if (target->kind == NodeKind::Getattr) {
    Value ns = lookup(target->a->name, s);
    if (ns.kind != Value::Kind::Namespace) fail_at(target->offset, "cannot assign attribute on non-namespace object");
    ns.dict->set(target->name, v);
  } else {
    fail_at(target->offset, "cannot assign to this expression");
  }
}

Value Interpreter::make_macro(const NodePtr& n, const ScopePtr& defining, const std::string& name) {
  Interpreter* self = this;
  return Value::callable(name, [self, n, defining, name](Interpreter&, CallArgs& args) -> Value {
    auto scope = std::make_shared<Scope>();
    scope->parent = defining;
    const auto& params = n->params;
    if (args.args.size() > params.size())
      runtime_fail("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
    std::vector<bool> bound(params.size(), false);
    for (size_t k = 0; k < args.args.size(); ++k) {
      scope->vars[params[k]] = args.args[k];
      bound[k] = true;
    }
    for (const auto& [key, val] : args.kwargs) {
      size_t k = 0;
      while (k < params.size() && params[k] != key) ++k;
      if (k == params.size()) {
        if (key == "caller") {
          scope->vars["caller"] = val;
          continue;
        }
        runtime_fail("macro '" + name + "' takes no keyword argument '" + key + "'");
      }
      if (bound[k]) runtime_fail("macro '" + name + "' got multiple values for argument '" + key + "'");
      scope->vars[key] = val;
      bound[k] = true;
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (bound[k]) continue;
      const NodePtr& def = k < n->kwvalues.size() ? n->kwvalues[k] : nullptr;
      scope->vars[params[k]] =
          def ? self->eval(def, scope) : Value::undefined("parameter '" + params[k] + "' was not provided");
    }
    std::string out;
    self->exec(n->body, scope, out);
    return Value::string(out);
  });
}

Interpreter::Flow Interpreter::exec_node(const NodePtr& n, const ScopePtr& s, std::string& out) {
  switch (n->kind) {
    case NodeKind::Data: out += n->name; return Flow::Normal;
    case NodeKind::Print: {
      Value v = eval(n->a, s);
      out += to_str(v);
      return Flow::Normal;
    }
    case NodeKind::If:
      if (eval(n->a, s).truthy()) return exec(n->body, s, out);
      return exec(n->else_body, s, out);
    case NodeKind::For: return exec_for(n, s, out);
    case NodeKind::Break: return Flow::Break;
    case NodeKind::Continue: return Flow::Continue;
    case NodeKind::Set: assign(n->a, eval(n->b, s), s); return Flow::Normal;
    case NodeKind::SetBlock: {
      std::string text;
      exec(n->body, s, text);
      Value v = Value::string(text);
      if (n->filter) v = apply_filters(n->filter, v, s);
      assign(n->a, v, s);
      return Flow::Normal;
    }
    case NodeKind::Macro: s->vars[n->name] = make_macro(n, s, n->name); return Flow::Normal;
    case NodeKind::CallBlock: {
      Value caller = make_macro(n, s, "caller");
      NodePtr call = n->a;
      Value callee = eval(call->a, s);
      CallArgs args = eval_args(call, s);
      args.kwargs.emplace_back("caller", caller);
      Value r;
      try {
        r = this->call(callee, args);
      } catch (const RuntimeFailure& f) {
        fail_at(call->offset, f.message);
      }
      out += to_str(r);
      return Flow::Normal;
    }
    case NodeKind::FilterBlock: {
      std::string text;
      exec(n->body, s, text);
      out += to_str(apply_filters(n->filter, Value::string(text), s));
      return Flow::Normal;
    }
    case NodeKind::With: {
      auto inner = std::make_shared<Scope>();
      inner->parent = s;
      for (size_t k = 0; k < n->params.size(); ++k) inner->vars[n->params[k]] = eval(n->kwvalues[k], s);
      return exec(n->body, inner, out);
    }
    case NodeKind::Scope: {
      auto inner = std::make_shared<Scope>();
      inner->parent = s;
      return exec(n->body, inner, out);
    }
    default: fail_at(n->offset, "unexpected node");
  }
}

Interpreter::Flow Interpreter::exec_for(const NodePtr& n, const ScopePtr& s, std::string& out) {
  Value seq = eval(n->b, s);
  std::vector<Value> items;
  try {
    items = iterate(seq);
  } catch (const RuntimeFailure& f) {
    fail_at(n->b->offset, f.message);
  }
  auto inner = std::make_shared<Scope>();
  inner->parent = s;
  if (n->filter) {
    std::vector<Value> kept;
    for (const auto& it : items) {
      assign(n->a, it, inner);
      if (eval(n->filter, inner).truthy()) kept.push_back(it);
    }
    items.swap(kept);
  }
  if (items.empty()) return exec(n->else_body, s, out);
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < len; ++k) {
    // jinja2 starts every iteration from the enclosing values: assignments don't carry over.
    inner = std::make_shared<Scope>();
    inner->parent = s;
    assign(n->a, items[k], inner);
    Value loop = Value::new_dict();
    auto& d = *loop.dict;
    d.set("index", Value::integer(k + 1));
    d.set("index0", Value::integer(k));
    d.set("revindex", Value::integer(len - k));
    d.set("revindex0", Value::integer(len - k - 1));
    d.set("first", Value::boolean(k == 0));
    d.set("last", Value::boolean(k == len - 1));
    d.set("length", Value::integer(len));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
    d.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("there is no next item"));
    d.set("cycle", Value::callable("cycle", [k](Interpreter&, CallArgs& a) -> Value {
            if (a.args.empty()) runtime_fail("no items for cycling given");
            return a.args[static_cast<size_t>(k) % a.args.size()];
          }));
    inner->vars["loop"] = loop;
    Flow f = exec(n->body, inner, out);
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interpreter::eval(const NodePtr& n, const ScopePtr& s) {
  try {
    return eval_impl(n, s);
  } catch (const RuntimeFailure& f) {
    fail_at(n->offset, f.message);
  }
}

CallArgs Interpreter::eval_args(const NodePtr& n, const ScopePtr& s) {
  CallArgs a;
  for (const auto& e : n->items) a.args.push_back(eval(e, s));
  for (size_t k = 0; k < n->kwnames.size(); ++k) a.kwargs.emplace_back(n->kwnames[k], eval(n->kwvalues[k], s));
  return a;
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_fail(callee);
  if (callee.kind != Value::Kind::Callable) runtime_fail("'" + callee.type_name() + "' object is not callable");
  return callee.fn->fn(*this, args);
}

Value Interpreter::apply_filters(const NodePtr& chain, const Value& input, const ScopePtr& s) {
  Value v = chain->a ? apply_filters(chain->a, input, s) : input;
  FilterFn f = find_filter(chain->name);
  if (!f) fail_at(chain->offset, "no filter named '" + chain->name + "'");
  CallArgs a = eval_args(chain, s);
  try {
    return f(*this, v, a);
  } catch (const RuntimeFailure& e) {
    fail_at(chain->offset, e.message);
  }
}

Value Interpreter::eval_impl(const NodePtr& n, const ScopePtr& s) {
  switch (n->kind) {
    case NodeKind::Const: return n->value;
    case NodeKind::Name: return lookup(n->name, s);
    case NodeKind::List:
    case NodeKind::Tuple: {
      std::vector<Value> items;
      for (const auto& e : n->items) items.push_back(eval(e, s));
      return Value::new_list(std::move(items), n->kind == NodeKind::Tuple);
    }
    case NodeKind::Dict: {
      Value d = Value::new_dict();
      for (size_t k = 0; k + 1 < n->items.size(); k += 2) {
        Value key = eval(n->items[k], s);
        if (!key.is_string()) runtime_fail("only string keys are supported in dict literals");
        d.dict->set(key.s, eval(n->items[k + 1], s));
      }
      return d;
    }
    case NodeKind::Getattr: return get_attr(eval(n->a, s), n->name);
    case NodeKind::Getitem: {
      Value obj = eval(n->a, s);
      if (n->b->kind == NodeKind::Slice) {
        const NodePtr& sl = n->b;
        Value a = sl->a ? eval(sl->a, s) : Value::none();
        Value b = sl->b ? eval(sl->b, s) : Value::none();
        Value c = sl->c ? eval(sl->c, s) : Value::none();
        if (obj.is_undefined()) undefined_fail(obj);
        return slice(obj, a, b, c);
      }
      return get_item(obj, eval(n->b, s));
    }
    case NodeKind::Slice: runtime_fail("slice outside of subscript");
    case NodeKind::Call: {
      Value callee = eval(n->a, s);
      CallArgs a = eval_args(n, s);
      return call(callee, a);
    }
    case NodeKind::Filter: {
      Value input = eval(n->a, s);
      FilterFn f = find_filter(n->name);
      if (!f) runtime_fail("no filter named '" + n->name + "'");
      CallArgs a = eval_args(n, s);
      return f(*this, input, a);
    }
    case NodeKind::Test: {
      Value v = eval(n->a, s);
      TestFn t = find_test(n->name);
      if (!t) runtime_fail("no test named '" + n->name + "'");
      CallArgs a = eval_args(n, s);
      return Value::boolean(t(*this, v, a));
    }
    case NodeKind::Neg:
    case NodeKind::Pos: {
      Value v = eval(n->a, s);
      if (v.is_undefined()) undefined_fail(v);
      if (!v.is_number()) runtime_fail("bad operand type for unary " + std::string(n->kind == NodeKind::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
      if (n->kind == NodeKind::Pos) return v.kind == Value::Kind::Bool ? Value::integer(v.b) : v;
      if (v.kind == Value::Kind::Float) return Value::number(-v.f);
      return Value::integer(-(v.kind == Value::Kind::Bool ? int64_t(v.b) : v.i));
    }
    case NodeKind::Not: return Value::boolean(!eval(n->a, s).truthy());
    case NodeKind::And: {
      Value l = eval(n->a, s);
      return l.truthy() ? eval(n->b, s) : l;
    }
    case NodeKind::Or: {
      Value l = eval(n->a, s);
      return l.truthy() ? l : eval(n->b, s);
    }
    case NodeKind::Binary: return binary_op(n->name, eval(n->a, s), eval(n->b, s));
    case NodeKind::Compare: {
      Value l = eval(n->a, s);
      for (size_t k = 0; k < n->params.size(); ++k) {
        Value r = eval(n->items[k], s);
        const std::string& op = n->params[k];
        bool ok;
        if (op == "==") ok = equals(l, r);
        else if (op == "!=") ok = !equals(l, r);
        else if (op == "in") ok = contains(r, l);
        else if (op == "notin") ok = !contains(r, l);
        else {
          if (l.is_undefined()) undefined_fail(l);
          if (r.is_undefined()) undefined_fail(r);
          if (op == "<") ok = less_than(l, r);
          else if (op == ">") ok = less_than(r, l);
          else if (op == "<=") ok = less_than(l, r) || equals(l, r);
          else ok = less_than(r, l) || equals(l, r);
        }
        if (!ok) return Value::boolean(false);
        l = r;
      }
      return Value::boolean(true);
    }
    case NodeKind::CondExpr:
      if (eval(n->a, s).truthy()) return eval(n->b, s);
      return n->c ? eval(n->c, s) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    case NodeKind::Concat: {
      std::string out;
      for (const auto& e : n->items) out += to_str(eval(e, s));
      return Value::string(out);
    }
    default: runtime_fail("statement used as expression");
  }
}

// ---- Python operations ----

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::List: return v.list->items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(v.s)) {
        std::string one;
        utf8_append(one, c);
        chars.push_back(Value::string(one));
      }
      return chars;
    }
    default: runtime_fail("'" + v.type_name() + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::String:
      if (item.is_undefined()) undefined_fail(item);
      if (!item.is_string()) runtime_fail("'in <string>' requires string as left operand, not " + item.type_name());
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::List:
      for (const auto& e : container.list->items)
        if (equals(e, item)) return true;
      return false;
    case Value::Kind::Dict:
      return item.is_string() && container.dict->find(item.s) != nullptr;
    case Value::Kind::Undefined: return false;
    default: runtime_fail("argument of type '" + container.type_name() + "' is not iterable");
  }
}

static int64_t as_int(const Value& v) { return v.kind == Value::Kind::Bool ? v.b : v.i; }
static bool is_intlike(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }

static Value repeat(const Value& seq, int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.s;
    return Value::string(out);
  }
  std::vector<Value> out;
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.list->items.begin(), seq.list->items.end());
  return Value::new_list(std::move(out), seq.tuple);
}

static std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> list = args.is_list() && args.tuple ? args.list->items : std::vector<Value>{args};
  std::string out;
  size_t ai = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out.push_back(fmt[k]);
      continue;
    }
    if (++k >= fmt.size()) runtime_fail("incomplete format");
    char c = fmt[k];
    if (c == '%') {
      out.push_back('%');
      continue;
    }
    if (ai >= list.size()) runtime_fail("not enough arguments for format string");
    const Value& a = list[ai++];
    if (c == 's') out += to_str(a);
    else if (c == 'r') out += repr(a);
    else if (c == 'd' || c == 'i') out += std::to_string(a.kind == Value::Kind::Float ? static_cast<int64_t>(a.f) : as_int(a));
    else runtime_fail(std::string("unsupported format character '") + c + "'");
  }
  if (ai < list.size()) runtime_fail("not all arguments converted during string formatting");
  return out;
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  auto unsupported = [&]() {
    runtime_fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool ints = is_intlike(a) && is_intlike(b);
    if (op == "+") return ints ? Value::integer(as_int(a) + as_int(b)) : Value::number(a.as_double() + b.as_double());
    if (op == "-") return ints ? Value::integer(as_int(a) - as_int(b)) : Value::number(a.as_double() - b.as_double());
    if (op == "*") return ints ? Value::integer(as_int(a) * as_int(b)) : Value::number(a.as_double() * b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) runtime_fail("division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) runtime_fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (ints) {
        int64_t x = as_int(a), y = as_int(b);
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      double x = a.as_double(), y = b.as_double();
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      if (op == "%") return Value::number(r);
      return Value::number(std::floor(x / y));
    }
    if (op == "**") {
      if (ints && as_int(b) >= 0) {
        int64_t r = 1, base = as_int(a);
        for (int64_t k = 0; k < as_int(b); ++k) r *= base;
        return Value::integer(r);
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
    unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      std::vector<Value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return Value::new_list(std::move(items), a.tuple);
    }
    if (a.is_string() && !b.is_string())
      runtime_fail("can only concatenate str (not \"" + b.type_name() + "\") to str");
    unsupported();
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && is_intlike(b)) return repeat(a, as_int(b));
    if ((b.is_string() || b.is_list()) && is_intlike(a)) return repeat(b, as_int(a));
    unsupported();
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b));
  unsupported();
  return Value();
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Value::Kind::Undefined: undefined_fail(obj);
    case Value::Kind::Dict: {
      Value m = get_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    case Value::Kind::None: return Value::undefined("'None' has no attribute '" + name + "'");
    default: {
      Value m = get_method(obj, name);
      if (!m.is_undefined()) return m;
      return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
    }
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Value::Kind::Undefined: undefined_fail(obj);
    case Value::Kind::Dict:
    case Value::Kind::Namespace:
      if (key.is_string()) {
        if (obj.kind == Value::Kind::Dict)
          if (const Value* v = obj.dict->find(key.s)) return *v;
        return get_attr(obj, key.s);
      }
      break;
    case Value::Kind::List:
    case Value::Kind::String:
      if (is_intlike(key)) {
        int64_t idx = as_int(key);
        if (obj.is_list()) {
          int64_t n = static_cast<int64_t>(obj.list->items.size());
          if (idx < 0) idx += n;
          if (idx >= 0 && idx < n) return obj.list->items[static_cast<size_t>(idx)];
        } else {
          std::u32string u = utf8_decode(obj.s);
          int64_t n = static_cast<int64_t>(u.size());
          if (idx < 0) idx += n;
          if (idx >= 0 && idx < n) {
            std::string one;
            utf8_append(one, u[static_cast<size_t>(idx)]);
            return Value::string(one);
          }
        }
        return Value::undefined("'" + obj.type_name() + " object' has no element " + repr(key));
      }
      if (key.is_string()) return get_attr(obj, key.s);
      break;
    default:
      if (key.is_string()) return get_attr(obj, key.s);
      break;
  }
  return Value::undefined("'" + obj.type_name() + " object' has no element " + repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!is_intlike(v)) runtime_fail(std::string("slice ") + what + " must be an integer or None");
    return as_int(v);
  };
  auto a = opt(start, "indices"), b = opt(stop, "indices"), c = opt(step, "indices");
  int64_t st = c.value_or(1);
  if (st == 0) runtime_fail("slice step cannot be zero");
  std::u32string u;
  int64_t n;
  if (obj.is_string()) {
    u = utf8_decode(obj.s);
    n = static_cast<int64_t>(u.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list->items.size());
  } else {
    runtime_fail("'" + obj.type_name() + "' object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  int64_t lo = clamp(a, st < 0 ? n - 1 : 0), hi = clamp(b, st < 0 ? -1 : n);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t k = lo; k < hi; k += st) idx.push_back(k);
  else
    for (int64_t k = lo; k > hi; k += st) idx.push_back(k);
  if (obj.is_string()) {
    std::u32string r;
    for (int64_t k : idx) r.push_back(u[static_cast<size_t>(k)]);
    return Value::string(utf8_encode(r));
  }
  std::vector<Value> items;
  for (int64_t k : idx) items.push_back(obj.list->items[static_cast<size_t>(k)]);
  return Value::new_list(std::move(items), obj.tuple);
}

}  // namespace fathom::chat
