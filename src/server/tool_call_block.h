// Internal to the tool-call parser: one <tool_call> block, parsed as its text arrives. The
// format's subclass walks the text after "<tool_call>" up to "</tool_call>", making the
// function's name known (once the call is sure enough to announce) and its arguments' JSON text
// in pieces. Its decisions depend only on the text, never on how it was split.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "server/tool_call_parser.h"

namespace fathom::server {

class ToolCallBlock {
 public:
  enum class Status { kMore, kDone, kFailed };
  virtual ~ToolCallBlock() = default;

  // Appends text and parses as far as it can.
  Status feed(std::string_view text);
  // The function's name once the call may be announced.
  const std::optional<std::string>& name() const { return name_; }
  // The arguments' text produced since the last call (all of it after kDone).
  std::string take_arguments() { return std::move(args_); }
  // All text fed; after kDone, text().substr(end()) followed the closing tag.
  const std::string& text() const { return buf_; }
  size_t end() const { return pos_; }

 protected:
  enum class Match { kYes, kMaybe, kNo };
  virtual Status parse() = 0;

  void skip_space();
  // Consumes `lit` at pos_ (kYes), or says whether the text so far could still begin it.
  Match match(std::string_view lit);
  Status fail() { return status_ = Status::kFailed; }

  std::string buf_;
  size_t pos_ = 0;
  std::optional<std::string> name_;
  std::string args_;
  Status status_ = Status::kMore;
};

std::unique_ptr<ToolCallBlock> make_hermes_block();
std::unique_ptr<ToolCallBlock> make_qwen3_coder_block(const nlohmann::ordered_json& tools);

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

}  // namespace fathom::server
