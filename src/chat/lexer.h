// Tokenizer for the Jinja2 subset used by chat templates, with jinja2's whitespace rules as
// configured by transformers (trim_blocks, lstrip_blocks, keep_trailing_newline=False).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fathom::chat {

enum class TokType { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Op, Eof };

struct Token {
  TokType type;
  std::string text;  // data text, name, operator, decoded string literal
  int64_t ival = 0;
  double fval = 0;
  size_t offset = 0;  // in the normalized source
};

// Maps offsets of the normalized source to 1-based line and column.
class SourceMap {
 public:
  explicit SourceMap(const std::string& src);
  std::pair<int, int> position(size_t offset) const;

 private:
  std::vector<size_t> line_starts_;
  const std::string* src_;
};

// Normalizes newlines (\r\n, \r -> \n) and drops one trailing newline, as jinja2 does.
std::string normalize_template_source(const std::string& source);

// Tokenizes a normalized source; throws fathom::Error with line:col on lexical errors.
std::vector<Token> tokenize(const std::string& src, const SourceMap& map);

}  // namespace fathom::chat
