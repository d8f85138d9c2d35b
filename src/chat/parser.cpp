#include "chat/parser.h"

#include <set>

#include "core/error.h"

namespace fathom::chat {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const SourceMap& map) : t_(toks), map_(map) {}

  std::vector<NodePtr> run() {
    auto body = statements({});
    if (cur().type != TokType::Eof) fail_here("unexpected tag '" + cur().text + "'");
    return body;
  }

 private:
  const std::vector<Token>& t_;
  const SourceMap& map_;
  size_t p_ = 0;

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }

  [[noreturn]] void fail_here(const std::string& msg) const {
    auto [line, col] = map_.position(cur().offset);
    fail("chat template syntax error at line ", line, ":", col, ": ", msg);
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokType::VarEnd: return "end of print statement";
      case TokType::BlockEnd: return "end of statement block";
      case TokType::Eof: return "end of template";
      case TokType::String: return "string";
      default: return "'" + t.text + "'";
    }
  }
  bool is_op(const char* op) const { return cur().type == TokType::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokType::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_here(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokType::Name) fail_here("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != TokType::BlockEnd) fail_here("expected end of statement block, got " + describe(cur()));
    next();
  }

  // Parses until a {% name %} with name in ends; leaves the cursor on that name token.
  std::vector<NodePtr> statements(const std::set<std::string>& ends) {
    std::vector<NodePtr> body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == TokType::Eof) {
        if (!ends.empty()) fail_here("unexpected end of template, expected " + *ends.begin());
        return body;
      }
      if (tk.type == TokType::Data) {
        auto n = make_node(NodeKind::Data, tk.offset);
        n->name = tk.text;
        body.push_back(n);
        next();
      } else if (tk.type == TokType::VarBegin) {
        next();
        auto n = make_node(NodeKind::Print, tk.offset);
        n->a = tuple_expr(true, {}, false);
        if (cur().type != TokType::VarEnd) fail_here("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(n);
      } else if (tk.type == TokType::BlockBegin) {
        next();
        if (cur().type == TokType::Name && ends.count(cur().text)) return body;
        body.push_back(statement());
      } else {
        fail_here("unexpected token " + describe(tk));
      }
    }
  }

  void end_tag(const char* name) {
    if (!skip_name(name)) fail_here(std::string("expected '") + name + "'");
    expect_block_end();
  }

  NodePtr statement() {
    const Token& kw = cur();
    if (kw.type != TokType::Name) fail_here("tag name expected");
    std::string k = kw.text;
    size_t off = kw.offset;
    next();
    if (k == "if") return parse_if(off);
    if (k == "for") return parse_for(off);
    if (k == "set") return parse_set(off);
    if (k == "macro") return parse_macro(off);
    if (k == "call") return parse_call_block(off);
    if (k == "break" || k == "continue") {
      expect_block_end();
      return make_node(k == "break" ? NodeKind::Break : NodeKind::Continue, off);
    }
    if (k == "filter") {
      auto n = make_node(NodeKind::FilterBlock, off);
      n->filter = filter_chain(nullptr, true);
      expect_block_end();
      n->body = statements({"endfilter"});
      end_tag("endfilter");
      return n;
    }
    if (k == "with") {
      auto n = make_node(NodeKind::With, off);
      while (cur().type != TokType::BlockEnd) {
        if (!n->params.empty()) expect_op(",");
        n->params.push_back(expect_name());
        expect_op("=");
        n->kwvalues.push_back(expression(true));
      }
      expect_block_end();
      n->body = statements({"endwith"});
      end_tag("endwith");
      return n;
    }
    if (k == "generation") {
      auto n = make_node(NodeKind::Scope, off);
      expect_block_end();
      n->body = statements({"endgeneration"});
      end_tag("endgeneration");
      return n;
    }
    p_--;
    fail_here("encountered unknown tag '" + k + "'");
  }

  NodePtr parse_if(size_t off) {
    auto n = make_node(NodeKind::If, off);
    n->a = tuple_expr(false, {}, false);
    expect_block_end();
    n->body = statements({"elif", "else", "endif"});
    if (skip_name("elif")) {
      n->else_body.push_back(parse_if(t_[p_ - 1].offset));
      return n;  // the nested if consumed endif
    }
    if (skip_name("else")) {
      expect_block_end();
      n->else_body = statements({"endif"});
    }
    end_tag("endif");
    return n;
  }

  NodePtr assign_target(bool with_namespace, const std::set<std::string>& extra_end) {
    size_t off = cur().offset;
    if (with_namespace && cur().type == TokType::Name && peek().type == TokType::Op && peek().text == ".") {
      auto n = make_node(NodeKind::Getattr, off);
      auto obj = make_node(NodeKind::Name, off);
      obj->name = next().text;
      next();
      n->a = obj;
      n->name = expect_name();
      return n;
    }
    std::vector<NodePtr> names;
    bool is_tuple = false, paren = skip_op("(");
    while (true) {
      if (!names.empty()) expect_op(",");
      if (cur().type == TokType::Name && extra_end.count(cur().text)) break;
      if (paren && is_op(")")) break;
      auto nm = make_node(NodeKind::Name, cur().offset);
      nm->name = expect_name();
      if (nm->name == "true" || nm->name == "false" || nm->name == "none" || nm->name == "True" ||
          nm->name == "False" || nm->name == "None")
        fail_here("can't assign to constant '" + nm->name + "'");
      names.push_back(nm);
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (paren) expect_op(")");
    if (!is_tuple && !paren && names.size() == 1) return names[0];
    if (!is_tuple && paren && names.size() == 1) return names[0];
    auto t = make_node(NodeKind::Tuple, off);
    t->items = names;
    return t;
  }

  NodePtr parse_for(size_t off) {
    auto n = make_node(NodeKind::For, off);
    n->a = assign_target(false, {"in"});
    if (!skip_name("in")) fail_here("expected 'in'");
    n->b = tuple_expr(false, {"recursive"}, false);
    if (skip_name("if")) n->filter = expression(true);
    if (skip_name("recursive")) n->recursive = true;
    expect_block_end();
    n->body = statements({"endfor", "else"});
    if (skip_name("else")) {
      expect_block_end();
      n->else_body = statements({"endfor"});
    }
    end_tag("endfor");
    return n;
  }

  NodePtr parse_set(size_t off) {
    NodePtr target = assign_target(true, {});
    if (skip_op("=")) {
      auto n = make_node(NodeKind::Set, off);
      n->a = target;
      n->b = tuple_expr(true, {}, false);
      expect_block_end();
      return n;
    }
    auto n = make_node(NodeKind::SetBlock, off);
    n->a = target;
    if (is_op("|")) n->filter = filter_chain(nullptr, false);
    expect_block_end();
    n->body = statements({"endset"});
    end_tag("endset");
    return n;
  }

  void signature(NodePtr& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      if (is_op(")")) break;
      n->params.push_back(expect_name());
      n->kwvalues.push_back(skip_op("=") ? expression(true) : nullptr);
    }
    expect_op(")");
  }

  NodePtr parse_macro(size_t off) {
    auto n = make_node(NodeKind::Macro, off);
    n->name = expect_name();
    signature(n);
    expect_block_end();
    n->body = statements({"endmacro"});
    end_tag("endmacro");
    return n;
  }

  NodePtr parse_call_block(size_t off) {
    auto n = make_node(NodeKind::CallBlock, off);
    if (is_op("(")) signature(n);
    n->a = expression(true);
    if (n->a->kind != NodeKind::Call) fail_here("expected call");
    expect_block_end();
    n->body = statements({"endcall"});
    end_tag("endcall");
    return n;
  }

  // ---- expressions ----
  bool tuple_end(const std::set<std::string>& extra) const {
    const Token& tk = cur();
    if (tk.type == TokType::VarEnd || tk.type == TokType::BlockEnd || tk.type == TokType::Eof) return true;
    if (tk.type == TokType::Op && tk.text == ")") return true;
    return tk.type == TokType::Name && extra.count(tk.text);
  }

  NodePtr tuple_expr(bool with_condexpr, const std::set<std::string>& extra, bool explicit_parens) {
    size_t off = cur().offset;
    std::vector<NodePtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      args.push_back(expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return args[0];
      if (!explicit_parens) fail_here("expected an expression, got " + describe(cur()));
    }
    auto t = make_node(NodeKind::Tuple, off);
    t->items = args;
    return t;
  }

  NodePtr expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    NodePtr e1 = parse_or();
    while (is_name("if")) {
      size_t off = cur().offset;
      next();
      auto n = make_node(NodeKind::CondExpr, off);
      n->a = parse_or();  // condition
      n->b = e1;          // value if true
      if (skip_name("else")) n->c = expression(true);
      e1 = n;
    }
    return e1;
  }

  NodePtr parse_or() {
    NodePtr l = parse_and();
    while (is_name("or")) {
      auto n = make_node(NodeKind::Or, next().offset);
      n->a = l;
      n->b = parse_and();
      l = n;
    }
    return l;
  }
  NodePtr parse_and() {
    NodePtr l = parse_not();
    while (is_name("and")) {
      auto n = make_node(NodeKind::And, next().offset);
      n->a = l;
      n->b = parse_not();
      l = n;
    }
    return l;
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      auto n = make_node(NodeKind::Not, next().offset);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    size_t off = cur().offset;
    NodePtr e = parse_math1();
    auto n = make_node(NodeKind::Compare, off);
    n->a = e;
    while (true) {
      if (cur().type == TokType::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        n->params.push_back(next().text);
      } else if (is_name("in")) {
        next();
        n->params.push_back("in");
      } else if (is_name("not") && peek().type == TokType::Name && peek().text == "in") {
        next();
        next();
        n->params.push_back("notin");
      } else {
        break;
      }
      n->items.push_back(parse_math1());
    }
    return n->params.empty() ? e : n;
  }
  NodePtr binary(NodePtr l, const std::string& op, NodePtr r, size_t off) {
    auto n = make_node(NodeKind::Binary, off);
    n->name = op;
    n->a = l;
    n->b = r;
    return n;
  }
  NodePtr parse_math1() {
    NodePtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      l = binary(l, op.text, parse_concat(), op.offset);
    }
    return l;
  }
  NodePtr parse_concat() {
    size_t off = cur().offset;
    std::vector<NodePtr> args{parse_math2()};
    while (skip_op("~")) args.push_back(parse_math2());
    if (args.size() == 1) return args[0];
    auto n = make_node(NodeKind::Concat, off);
    n->items = args;
    return n;
  }
  NodePtr parse_math2() {
    NodePtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      l = binary(l, op.text, parse_pow(), op.offset);
    }
    return l;
  }
  NodePtr parse_pow() {
    NodePtr l = parse_unary(true);
    while (is_op("**")) {
      const Token& op = next();
      l = binary(l, "**", parse_unary(true), op.offset);
    }
    return l;
  }
  NodePtr parse_unary(bool with_filter) {
    NodePtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      node = make_node(op.text == "-" ? NodeKind::Neg : NodeKind::Pos, op.offset);
      node->a = parse_unary(false);
    } else {
      node = primary();
    }
    node = postfix(node);
    if (with_filter) node = filter_expr(node);
    return node;
  }

  NodePtr primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case TokType::Name: {
        next();
        auto n = make_node(NodeKind::Const, tk.offset);
        if (tk.text == "true" || tk.text == "True") n->value = Value::boolean(true);
        else if (tk.text == "false" || tk.text == "False") n->value = Value::boolean(false);
        else if (tk.text == "none" || tk.text == "None") n->value = Value::none();
        else {
          n->kind = NodeKind::Name;
          n->name = tk.text;
        }
        return n;
      }
      case TokType::String: {
        std::string s;
        size_t off = tk.offset;
        while (cur().type == TokType::String) s += next().text;
        auto n = make_node(NodeKind::Const, off);
        n->value = Value::string(s);
        return n;
      }
      case TokType::Integer:
      case TokType::Float: {
        next();
        auto n = make_node(NodeKind::Const, tk.offset);
        n->value = tk.type == TokType::Integer ? Value::integer(tk.ival) : Value::number(tk.fval);
        return n;
      }
      case TokType::Op:
        if (tk.text == "(") {
          next();
          NodePtr e = tuple_expr(true, {}, true);
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          next();
          auto n = make_node(NodeKind::List, tk.offset);
          while (!is_op("]")) {
            if (!n->items.empty()) expect_op(",");
            if (is_op("]")) break;
            n->items.push_back(expression(true));
          }
          expect_op("]");
          return n;
        }
        if (tk.text == "{") {
          next();
          auto n = make_node(NodeKind::Dict, tk.offset);
          while (!is_op("}")) {
            if (!n->items.empty()) expect_op(",");
            if (is_op("}")) break;
            n->items.push_back(expression(true));
            expect_op(":");
            n->items.push_back(expression(true));
          }
          expect_op("}");
          return n;
        }
        break;
      default: break;
    }
    fail_here("unexpected " + describe(tk));
  }

  NodePtr postfix(NodePtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) node = subscript(node);
      else if (is_op("(")) node = call(node);
      else return node;
    }
  }

  NodePtr filter_expr(NodePtr node) {
    while (true) {
      if (is_op("|")) node = filter_chain(node, false);
      else if (is_name("is")) node = test(node);
      else if (is_op("(")) node = call(node);
      else return node;
    }
  }

  NodePtr subscript(NodePtr node) {
    const Token& tk = next();
    if (tk.text == ".") {
      if (cur().type == TokType::Name) {
        auto n = make_node(NodeKind::Getattr, tk.offset);
        n->a = node;
        n->name = next().text;
        return n;
      }
      if (cur().type == TokType::Integer) {
        auto n = make_node(NodeKind::Getitem, tk.offset);
        n->a = node;
        n->b = make_node(NodeKind::Const, cur().offset);
        n->b->value = Value::integer(next().ival);
        return n;
      }
      fail_here("expected name or number");
    }
    std::vector<NodePtr> args;
    while (!is_op("]")) {
      if (!args.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      args.push_back(subscribed());
    }
    expect_op("]");
    auto n = make_node(NodeKind::Getitem, tk.offset);
    n->a = node;
    if (args.size() == 1) {
      n->b = args[0];
    } else {
      n->b = make_node(NodeKind::Tuple, tk.offset);
      n->b->items = args;
    }
    return n;
  }

  NodePtr subscribed() {
    size_t off = cur().offset;
    auto n = make_node(NodeKind::Slice, off);
    if (is_op(":")) {
      next();
    } else {
      NodePtr e = expression(true);
      if (!is_op(":")) return e;
      next();
      n->a = e;
    }
    if (!is_op(":") && !is_op("]") && !is_op(",")) n->b = expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) n->c = expression(true);
    }
    return n;
  }

  void call_args(NodePtr& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**")) fail_here("*args / **kwargs calls are not supported");
      if (cur().type == TokType::Name && peek().type == TokType::Op && peek().text == "=") {
        n->kwnames.push_back(next().text);
        next();
        n->kwvalues.push_back(expression(true));
      } else {
        if (!n->kwnames.empty()) fail_here("positional argument after keyword argument");
        n->items.push_back(expression(true));
      }
    }
    expect_op(")");
  }

  NodePtr call(NodePtr node) {
    auto n = make_node(NodeKind::Call, node->offset);
    n->a = node;
    call_args(n);
    return n;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  NodePtr filter_chain(NodePtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto n = make_node(NodeKind::Filter, cur().offset);
      n->name = dotted_name();
      if (is_op("(")) call_args(n);
      n->a = node;
      node = n;
    }
    return node;
  }

  NodePtr test(NodePtr node) {
    size_t off = next().offset;  // 'is'
    bool negated = skip_name("not");
    auto n = make_node(NodeKind::Test, off);
    n->a = node;
    n->name = dotted_name();
    const Token& tk = cur();
    if (is_op("(")) {
      call_args(n);
    } else if ((tk.type == TokType::Name || tk.type == TokType::String || tk.type == TokType::Integer ||
                tk.type == TokType::Float || (tk.type == TokType::Op && (tk.text == "(" || tk.text == "[" || tk.text == "{"))) &&
               !(tk.type == TokType::Name && (tk.text == "else" || tk.text == "or" || tk.text == "and"))) {
      if (is_name("is")) fail_here("You cannot chain multiple tests with is");
      n->items.push_back(postfix(primary()));
    }
    if (!negated) return n;
    auto neg = make_node(NodeKind::Not, off);
    neg->a = n;
    return neg;
  }
};

}  // namespace

std::vector<NodePtr> parse_template(const std::vector<Token>& tokens, const SourceMap& map) {
  return Parser(tokens, map).run();
}

}  // namespace fathom::chat
