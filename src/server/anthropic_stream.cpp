#include "server/anthropic_stream.h"

#include "server/anthropic_messages.h"
#include "server/chat_sse.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

std::string anthropic_event(const json& data) {
  return "event: " + data.at("type").get<std::string>() + "\ndata: " +
         data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string AnthropicStream::start() {
  const json msg = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_},
                    {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", input_tokens_}, {"output_tokens", 0}}}};
  return anthropic_event({{"type", "message_start"}, {"message", msg}}) + anthropic_event({{"type", "ping"}});
}

std::string AnthropicStream::feed(std::string_view sse) {
  return map_chat_chunks(sse, [this](const json& chunk) { return on_chunk(chunk); });
}

std::string AnthropicStream::open(Block kind, json block) {
  std::string out = close();
  block_ = kind;
  ++index_;
  return out + anthropic_event({{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
}

std::string AnthropicStream::close() {
  if (block_ == Block::None) return "";
  block_ = Block::None;
  return anthropic_event({{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::delta(json d) {
  return anthropic_event({{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
}

std::string AnthropicStream::on_chunk(const json& chunk) {
  if (auto e = chunk.find("error"); e != chunk.end()) {
    if (error_.is_null()) error_ = *e;
    return "";
  }
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) output_tokens_ = u->value("completion_tokens", int64_t(0));
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || choices->empty()) return "";
  const json& c = choices->at(0);
  std::string out;
  const json& d = c.value("delta", json::object());
  if (auto r = d.find("reasoning_content"); r != d.end() && r->is_string() && !r->get<std::string>().empty()) {
    if (block_ != Block::Thinking) out += open(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    out += delta({{"type", "thinking_delta"}, {"thinking", *r}});
  }
  if (auto t = d.find("content"); t != d.end() && t->is_string() && !t->get<std::string>().empty()) {
    if (block_ != Block::Text) out += open(Block::Text, {{"type", "text"}, {"text", ""}});
    out += delta({{"type", "text_delta"}, {"text", *t}});
  }
  if (auto calls = d.find("tool_calls"); calls != d.end() && calls->is_array())
    for (const auto& tc : *calls) {
      const int i = tc.value("index", 0);
      const json fn = tc.value("function", json::object());
      if (block_ != Block::Tool || i != tool_index_) {  // a call's first chunk has its id and name
        tool_index_ = i;
        called_ = true;
        out += open(Block::Tool, {{"type", "tool_use"}, {"id", tc.value("id", "")}, {"name", fn.value("name", "")},
                                  {"input", json::object()}});
      }
      if (auto a = fn.find("arguments"); a != fn.end() && a->is_string() && !a->get<std::string>().empty())
        out += delta({{"type", "input_json_delta"}, {"partial_json", *a}});
    }
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
    finish_reason_ = f->get<std::string>();
    stop_reason_ = c.value("stop_reason", json());
  }
  return out;
}

std::string AnthropicStream::finish() {
  std::string out = close();
  if (!error_.is_null())
    return out + anthropic_event(anthropic_error_json(ApiError{500, error_.value("message", "internal error"), "", ""}));
  // Aborted (the server shuts down): Anthropic has no stop_reason for it, so the stream fails.
  if (finish_reason_ == "abort")
    return out + anthropic_event(anthropic_error_json(ApiError{503, "the request was aborted (the server is shutting down)", "", ""}));
  json stop_sequence;
  std::string reason = anthropic_stop_reason(finish_reason_, stop_reason_, &stop_sequence);
  if (called_) reason = "tool_use";
  out += anthropic_event({{"type", "message_delta"},
                          {"delta", {{"stop_reason", reason}, {"stop_sequence", stop_sequence}}},
                          {"usage", {{"output_tokens", output_tokens_}}}});
  return out + anthropic_event({{"type", "message_stop"}});
}

}  // namespace fathom::server
