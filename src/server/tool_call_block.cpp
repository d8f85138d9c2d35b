#include "server/tool_call_block.h"

#include "server/stream_text.h"

namespace fathom::server {

ToolCallBlock::Status ToolCallBlock::feed(std::string_view text) {
  if (status_ != Status::kMore) return status_;
  buf_.append(text);
  status_ = parse();
  return status_;
}

void ToolCallBlock::skip_space() {
  while (pos_ < buf_.size() && is_space(buf_[pos_])) ++pos_;
}

ToolCallBlock::Match ToolCallBlock::match(std::string_view lit) {
  const std::string_view rest = std::string_view(buf_).substr(pos_);
  if (rest.substr(0, lit.size()) == lit) {
    pos_ += lit.size();
    return Match::kYes;
  }
  return (rest.size() < lit.size() && lit.substr(0, rest.size()) == rest) ? Match::kMaybe : Match::kNo;
}

}  // namespace fathom::server
