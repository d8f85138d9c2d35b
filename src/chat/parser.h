// Recursive-descent parser producing the statement list of a template; mirrors jinja2's
// grammar and operator precedence (jinja2/parser.py).
#pragma once
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace fathom::chat {

std::vector<NodePtr> parse_template(const std::vector<Token>& tokens, const SourceMap& map);

}  // namespace fathom::chat
