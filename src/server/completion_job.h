// One client request in flight (its n choices per prompt), and how its engine events become
// OpenAI responses: the whole JSON body when it ends, or SSE chunks as it streams. Touched by
// one thread at a time (the connection's strand).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/request.h"
#include "server/protocol.h"
#include "server/request_parser.h"
#include "server/tool_call_parser.h"

namespace fathom::tok {
class Tokenizer;
}

namespace fathom::server {

class CompletionJob {
 public:
  // `tokenizer` may be null (token ids stand in for token text in logprobs). With `tools`
  // (--tool-call-parser) and a chat request that told the model about tools, the content's tool
  // calls become message.tool_calls (delta.tool_calls when streaming).
  CompletionJob(const ParsedRequest& request, std::string id, std::string model, bool reasoning,
                const tok::Tokenizer* tokenizer, std::optional<ToolCallFormat> tools = std::nullopt,
                ToolCallIdGenerator tool_ids = random_tool_call_ids());

  bool stream() const { return stream_; }
  int num_choices() const { return int(choices_.size()); }
  bool done() const { return remaining_ == 0; }
  // The first error event's message ("" when none), and whether any choice was aborted.
  const std::string& error() const { return error_; }
  bool aborted() const { return aborted_; }

  // Streaming: the chunks sent before any token (the chat role, the echoed prompt).
  std::string sse_start();
  // Applies one engine event; streaming: returns its SSE chunk ("" when there is nothing to send).
  std::string apply(RequestOutput& ev);
  // Streaming: after the last event, the usage chunk (if asked) and [DONE]; with an error, an
  // error event first.
  std::string sse_end();
  // Not streaming: the response body once done().
  nlohmann::ordered_json response();

 private:
  struct Choice {
    std::string text;  // completions text / chat raw text
    std::vector<int32_t> token_ids;
    std::vector<TokenLogprob> logprobs;
    std::string reasoning, content;
    std::string held_reasoning;  // stream_reasoning false: the reasoning not sent yet
    std::unique_ptr<ReasoningParser> reasoning_parser;
    std::unique_ptr<ToolCallStreamParser> tool_parser;  // streaming only
    std::string forced_id;  // tool_choice required / named: the call id sent (streaming)
    std::string finish_reason;
    nlohmann::ordered_json stop_reason = nullptr;
    int completion_tokens = 0;
    int cached_tokens = 0;
    size_t text_offset = 0;
  };
  std::string token_str(int32_t id) const;
  nlohmann::ordered_json logprobs_json(Choice& c, const std::vector<TokenLogprob>& lps) const;
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json chunk_base() const;
  // This event's reasoning delta as sent: dropped (include_reasoning false) or held until the
  // reasoning ends (stream_reasoning false).
  std::string reasoning_delta(Choice& c, std::string d_reason, bool finished) const;
  // Streaming: a content delta through the tool-call parser; fills delta.content / tool_calls.
  void stream_tools(Choice& c, const std::string& d_content, bool finished, nlohmann::ordered_json& delta);
  // The final finish_reason: "tool_calls" when the model called a tool and ended by itself or length.
  static std::string finish_reason_of(const Choice& c, int calls);
  bool forced_tool_choice() const {
    return tool_choice_ == ParsedRequest::ToolChoice::Required || tool_choice_ == ParsedRequest::ToolChoice::Named;
  }
  // tool_choice required / named: the output (JSON, by grammar) as calls; false if it is not.
  // length_cut: the output was cut by max_tokens; a cut "required" list gives its complete calls
  // and sets *cut.
  bool forced_calls(const std::string& text, std::vector<ToolCall>& calls, bool length_cut = false, bool* cut = nullptr);
  void stream_forced(Choice& c, const std::string& d_content, bool finished, nlohmann::ordered_json& delta);

  const tok::Tokenizer* tok_;
  bool chat_, stream_, include_usage_, return_token_ids_, reasoning_;
  bool include_reasoning_, stream_reasoning_;  // ParsedRequest::Reasoning
  int logprobs_, n_;
  std::string id_, model_;
  int64_t created_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::string> echo_texts_;
  std::vector<Choice> choices_;
  std::optional<ToolCallFormat> tool_format_;  // set when this request's output is parsed for calls
  ParsedRequest::ToolChoice tool_choice_ = ParsedRequest::ToolChoice::Auto;
  std::string tool_choice_name_;
  nlohmann::ordered_json tools_;
  ToolCallIdGenerator tool_ids_;
  int remaining_;
  int64_t prompt_tokens_ = 0;
  std::string error_;
  bool aborted_ = false;
};

}  // namespace fathom::server
