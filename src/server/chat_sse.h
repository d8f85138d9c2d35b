// The chunks of the chat completion SSE text a streaming CompletionJob writes, for the streams
// that turn them into another protocol's events (anthropic_stream.h, responses_stream.h).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fathom::server {

// Each "data: {...}" event of `sse` parsed and passed to `on_chunk` (which returns the text to
// write), in order; "[DONE]" and other lines are skipped. Returns the texts joined.
template <class F>
std::string map_chat_chunks(std::string_view sse, F&& on_chunk) {
  std::string out;
  size_t pos = 0;
  while (pos < sse.size()) {
    size_t end = sse.find("\n\n", pos);
    if (end == std::string_view::npos) end = sse.size();
    std::string_view ev = sse.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    ev.remove_prefix(6);
    if (ev == "[DONE]") continue;
    out += on_chunk(nlohmann::ordered_json::parse(ev));
  }
  return out;
}

}  // namespace fathom::server
