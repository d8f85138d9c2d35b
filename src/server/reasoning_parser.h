// The qwen3 reasoning parser (vLLM's --reasoning-parser qwen3, for Qwen3 and Qwen3.5): the text
// before "</think>" is reasoning_content, what follows is content (for the tool-call parser to
// read next). When the prompt already ends with "<think>" (Qwen3.5's template) the output starts
// inside the reasoning; otherwise a leading "<think>" opens it. A "<tool_call>" inside the
// reasoning also ends it (Qwen3.5 may skip "</think>"). Nothing is trimmed, as in vLLM.
#pragma once
#include <string>
#include <string_view>

namespace fathom::server {

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning) : in_reasoning_(starts_in_reasoning) {}
  // Feeds new text (any split); appends to `reasoning` / `content` what is certain so far. A
  // possible tag and an unfinished UTF-8 character are held back.
  void feed(const std::string& delta, std::string& reasoning, std::string& content);
  // End of output: releases anything held back.
  void finish(std::string& reasoning, std::string& content);
  // Whether the text fed so far ends inside the reasoning.
  bool in_reasoning() const { return in_reasoning_; }
  // Whether the rendered prompt ends inside an open "<think>" (trailing whitespace aside).
  static bool prompt_opens_reasoning(const std::string& prompt);

 private:
  bool in_reasoning_;
  bool started_ = false;  // some output was seen (a leading "<think>" is only stripped at the start)
  std::string buf_;
};

struct ReasoningSplit {
  std::string reasoning;  // empty: none
  std::string content;
};

// The whole output split at once; equal to feeding it in any pieces.
ReasoningSplit split_reasoning(std::string_view text, bool starts_in_reasoning);

}  // namespace fathom::server
