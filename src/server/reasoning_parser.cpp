#include "server/reasoning_parser.h"

#include <algorithm>

#include "server/stream_text.h"

namespace fathom::server {

static constexpr std::string_view kOpen = "<think>", kClose = "</think>", kTool = "<tool_call>";

bool ReasoningParser::prompt_opens_reasoning(const std::string& prompt) {
  size_t end = prompt.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return false;
  std::string_view head(prompt.data(), end + 1);
  return head.size() >= kOpen.size() && head.substr(head.size() - kOpen.size()) == kOpen;
}

// Moves the first `n` bytes of `buf` to `out`, keeping back an unfinished UTF-8 character.
static void take(std::string& buf, size_t n, std::string& out) {
  n -= incomplete_utf8_tail(std::string_view(buf).substr(0, n));
  out.append(buf, 0, n);
  buf.erase(0, n);
}

void ReasoningParser::feed(const std::string& delta, std::string& reasoning, std::string& content) {
  buf_ += delta;
  while (!buf_.empty()) {
    if (!started_) {
      // A leading "<think>" (template without the injected tag) opens the reasoning.
      size_t ws = buf_.find_first_not_of(" \t\r\n");
      if (ws == std::string::npos) return;  // only whitespace so far: wait
      std::string_view rest(buf_.data() + ws, buf_.size() - ws);
      if (rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return;  // maybe "<think>"
      started_ = true;
      if (rest.substr(0, kOpen.size()) == kOpen) {
        in_reasoning_ = true;
        buf_.erase(0, ws + kOpen.size());
        continue;
      }
    }
    if (!in_reasoning_) return take(buf_, buf_.size(), content);
    const size_t c = buf_.find(kClose), t = buf_.find(kTool);
    if (c != std::string::npos && (t == std::string::npos || c < t)) {
      reasoning.append(buf_, 0, c);
      buf_.erase(0, c + kClose.size());
      in_reasoning_ = false;
    } else if (t != std::string::npos) {
      reasoning.append(buf_, 0, t);
      buf_.erase(0, t);  // the tool call is content
      in_reasoning_ = false;
    } else {
      const size_t hold = std::max(partial_tag_suffix(buf_, kClose), partial_tag_suffix(buf_, kTool));
      return take(buf_, buf_.size() - hold, reasoning);
    }
  }
}

void ReasoningParser::finish(std::string& reasoning, std::string& content) {
  if (!started_ && !buf_.empty()) started_ = true;
  (in_reasoning_ ? reasoning : content) += buf_;
  buf_.clear();
}

ReasoningSplit split_reasoning(std::string_view text, bool starts_in_reasoning) {
  ReasoningParser parser(starts_in_reasoning);
  ReasoningSplit out;
  parser.feed(std::string(text), out.reasoning, out.content);
  parser.finish(out.reasoning, out.content);
  return out;
}

}  // namespace fathom::server
