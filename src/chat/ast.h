// Syntax tree of a parsed chat template: one Node type with a kind tag, as the subset is small.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/value.h"

namespace fathom::chat {

enum class NodeKind {
  // expressions
  Const, Name, List, Tuple, Dict, Getattr, Getitem, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Binary,
  Compare, CondExpr, Concat,
  // statements
  Data, Print, If, For, Set, SetBlock, Macro, CallBlock, Break, Continue, FilterBlock, With, Scope
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  NodeKind kind;
  size_t offset = 0;  // position in the normalized source (for line:col in errors)
  std::string name;   // Name, Getattr attr, Filter/Test name, Binary operator, Data text, Macro name
  Value value;        // Const
  NodePtr a, b, c;    // operands: object/lhs/test, index/rhs/iter/body-expr, step/else-expr
  std::vector<NodePtr> items;  // List/Tuple/Dict (key,value,...) elements, call positional args
  std::vector<std::string> kwnames;
  std::vector<NodePtr> kwvalues;  // call keyword args, macro defaults (aligned with params)
  std::vector<std::string> params;  // Macro / CallBlock parameter names, Compare operators
  std::vector<NodePtr> body, else_body;
  NodePtr filter;  // For's filter condition; SetBlock/FilterBlock filter chain
  bool recursive = false;
};

inline NodePtr make_node(NodeKind k, size_t offset) {
  auto n = std::make_shared<Node>();
  n->kind = k;
  n->offset = offset;
  return n;
}

}  // namespace fathom::chat
