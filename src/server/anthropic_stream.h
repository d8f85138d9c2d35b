// Anthropic's streaming events for /v1/messages, made from the chat completion chunks a
// streaming CompletionJob writes: message_start, then per content block content_block_start,
// content_block_delta (thinking_delta / text_delta / input_json_delta) and content_block_stop,
// then message_delta (stop_reason, usage) and message_stop. A block opens when the chunks turn
// from one kind of output to another (reasoning, content, a tool call).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fathom::server {

class AnthropicStream {
 public:
  AnthropicStream(std::string id, std::string model, int64_t input_tokens)
      : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

  // message_start and a ping.
  std::string start();
  // The events for chat SSE text ("data: {...}\n\n" chunks, any number, "[DONE]" skipped).
  std::string feed(std::string_view chat_sse);
  // The open block's stop, message_delta and message_stop (or an error event when a chunk held
  // an error, or an abort).
  std::string finish();

 private:
  enum class Block { None, Thinking, Text, Tool };
  std::string on_chunk(const nlohmann::ordered_json& chunk);
  std::string open(Block kind, nlohmann::ordered_json block);
  std::string close();
  std::string delta(nlohmann::ordered_json d);

  std::string id_, model_;
  int64_t input_tokens_ = 0, output_tokens_ = 0;
  Block block_ = Block::None;
  int index_ = -1;       // the open (or last) block's index
  int tool_index_ = -1;  // the chat tool call the open Tool block is
  bool called_ = false;
  std::string finish_reason_;
  nlohmann::ordered_json stop_reason_;
  nlohmann::ordered_json error_;  // the first error chunk's "error", else null
};

// One SSE event as Anthropic writes it: "event: <type>\ndata: <json>\n\n".
std::string anthropic_event(const nlohmann::ordered_json& data);

}  // namespace fathom::server
