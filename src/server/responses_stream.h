// The Responses API's streaming events for /v1/responses, made from the chat completion chunks a
// streaming CompletionJob writes (as anthropic_stream.h does for Anthropic's): response.created and
// response.in_progress, then per output item response.output_item.added, its deltas
// (response.reasoning_text.delta; response.content_part.added and response.output_text.delta;
// response.function_call_arguments.delta), their .done events and response.output_item.done, then
// response.completed (or response.incomplete at max_output_tokens) with the whole Response. Each
// event carries a sequence_number. An item opens when the chunks turn from one kind of output to
// another (reasoning, text, a tool call).
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fathom::server {

class ResponsesStream {
 public:
  // `response`: the Response object with status in_progress and no output (the request's echo).
  ResponsesStream(nlohmann::ordered_json response, std::function<std::string(const char*)> new_id)
      : response_(std::move(response)), new_id_(std::move(new_id)) {}

  std::string start();                       // response.created, response.in_progress
  std::string feed(std::string_view chat_sse);  // the events for chat SSE text
  // The open item's .done events and response.completed / response.incomplete (or an error event
  // when a chunk held an error, or an abort).
  std::string finish();
  // The output items so far (complete after finish()), and the final status.
  const nlohmann::ordered_json& output() const { return output_; }
  bool completed() const { return completed_; }

 private:
  enum class Item { None, Reasoning, Message, Call };
  std::string event(nlohmann::ordered_json data);
  std::string on_chunk(const nlohmann::ordered_json& chunk);
  std::string open(Item kind, nlohmann::ordered_json item);
  std::string close();

  nlohmann::ordered_json response_;
  std::function<std::string(const char*)> new_id_;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  int64_t sequence_ = 0;
  Item item_ = Item::None;
  int tool_index_ = -1;     // the chat tool call the open Call item is
  std::string text_;        // the open item's text so far (reasoning, output text or arguments)
  nlohmann::ordered_json usage_;
  std::string finish_reason_;
  nlohmann::ordered_json error_;
  bool completed_ = false;
};

}  // namespace fathom::server
