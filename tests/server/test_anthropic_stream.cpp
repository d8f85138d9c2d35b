// Anthropic's streaming events from chat chunks (server/anthropic_stream.h): the event order,
// block boundaries between thinking, text and tool calls, stop_reason and usage at the end.
#include <gtest/gtest.h>

#include <vector>

#include "server/anthropic_stream.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

std::string chunk(json delta, json finish = nullptr, json stop = nullptr) {
  json c = {{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish}};
  if (!finish.is_null()) c["stop_reason"] = stop;
  return "data: " + json{{"object", "chat.completion.chunk"}, {"choices", json::array({c})}}.dump() + "\n\n";
}

// Each event as {"event": name, "data": json}, checking that the name is the data's type.
std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string ev = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    const json data = json::parse(ev.substr(nl + 7));
    EXPECT_EQ(data["type"], ev.substr(7, nl - 7));
    out.push_back(data);
  }
  return out;
}

// start(), feed() of each piece, finish(), in that order (operands of + are not sequenced).
std::string run(AnthropicStream& s, const std::vector<std::string>& pieces) {
  std::string out = s.start();
  for (const auto& p : pieces) out += s.feed(p);
  return out + s.finish();
}

std::vector<std::string> types(const std::vector<json>& evs) {
  std::vector<std::string> t;
  for (const auto& e : evs) t.push_back(e["type"]);
  return t;
}

TEST(AnthropicStream, ThinkingThenTextThenToolCall) {
  AnthropicStream s("msg_1", "m", 9);
  std::string sse = s.start();
  sse += s.feed(chunk({{"role", "assistant"}, {"content", ""}}));
  sse += s.feed(chunk({{"reasoning_content", "hm"}}) + chunk({{"reasoning_content", "m"}}));
  sse += s.feed(chunk({{"content", "Hi"}}));
  sse += s.feed(chunk({{"tool_calls", json::parse(R"([{"index": 0, "id": "toolu_1", "type": "function",
                                                       "function": {"name": "get", "arguments": ""}}])")}}));
  sse += s.feed(chunk({{"tool_calls", json::parse(R"([{"index": 0, "function": {"arguments": "{\"a\""}}])")}}));
  sse += s.feed(chunk({{"tool_calls", json::parse(R"([{"index": 0, "function": {"arguments": ": 1}"}}])")}}, "tool_calls"));
  sse += s.feed("data: " + json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 9}, {"completion_tokens", 7}}}}.dump() +
                "\n\ndata: [DONE]\n\n");
  sse += s.finish();
  const auto evs = events_of(sse);
  EXPECT_EQ(types(evs), (std::vector<std::string>{
                            "message_start", "ping",
                            "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                            "content_block_start", "content_block_delta", "content_block_stop",
                            "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                            "message_delta", "message_stop"}));
  EXPECT_EQ(evs[0]["message"]["id"], "msg_1");
  EXPECT_EQ(evs[0]["message"]["usage"]["input_tokens"], 9);
  EXPECT_EQ(evs[2]["content_block"]["type"], "thinking");
  EXPECT_EQ(evs[3]["delta"], (json{{"type", "thinking_delta"}, {"thinking", "hm"}}));
  EXPECT_EQ(evs[6]["index"], 1);
  EXPECT_EQ(evs[6]["content_block"]["type"], "text");
  EXPECT_EQ(evs[7]["delta"], (json{{"type", "text_delta"}, {"text", "Hi"}}));
  EXPECT_EQ(evs[9]["index"], 2);
  EXPECT_EQ(evs[9]["content_block"], (json{{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get"}, {"input", json::object()}}));
  EXPECT_EQ(evs[10]["delta"]["type"], "input_json_delta");
  EXPECT_EQ(evs[10]["delta"]["partial_json"].get<std::string>() + evs[11]["delta"]["partial_json"].get<std::string>(), "{\"a\": 1}");
  EXPECT_EQ(evs[12]["index"], 2);
  EXPECT_EQ(evs[13]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(evs[13]["usage"]["output_tokens"], 7);
}

TEST(AnthropicStream, StopSequenceAndMaxTokens) {
  AnthropicStream s("m1", "m", 1);
  auto evs = events_of(run(s, {chunk({{"content", "a"}}, "stop", "END")}));
  EXPECT_EQ(evs.back()["type"], "message_stop");
  EXPECT_EQ(evs[evs.size() - 2]["delta"], (json{{"stop_reason", "stop_sequence"}, {"stop_sequence", "END"}}));
  AnthropicStream l("m2", "m", 1);
  evs = events_of(run(l, {chunk({{"content", "a"}}, "length")}));
  EXPECT_EQ(evs[evs.size() - 2]["delta"]["stop_reason"], "max_tokens");
  AnthropicStream e("m3", "m", 1);  // the model's own end: end_turn, and no block when no output
  evs = events_of(run(e, {chunk({{"content", ""}}, "stop", 151645)}));
  EXPECT_EQ(types(evs), (std::vector<std::string>{"message_start", "ping", "message_delta", "message_stop"}));
  EXPECT_EQ(evs[2]["delta"]["stop_reason"], "end_turn");
}

TEST(AnthropicStream, AnErrorChunkEndsWithAnErrorEvent) {
  AnthropicStream s("m1", "m", 1);
  const auto evs =
      events_of(run(s, {chunk({{"content", "a"}}), "data: {\"error\": {\"message\": \"boom\"}}\n\ndata: [DONE]\n\n"}));
  EXPECT_EQ(evs.back()["type"], "error");
  EXPECT_EQ(evs.back()["error"]["type"], "api_error");
  EXPECT_EQ(evs.back()["error"]["message"], "boom");
  EXPECT_EQ(evs[evs.size() - 2]["type"], "content_block_stop");  // the open block is closed first
}

TEST(AnthropicStream, AnAbortEndsWithAnOverloadedError) {
  AnthropicStream s("m1", "m", 1);
  const auto evs = events_of(run(s, {chunk({{"content", "a"}}, "abort")}));
  EXPECT_EQ(evs.back()["type"], "error");
  EXPECT_EQ(evs.back()["error"]["type"], "overloaded_error");
}

}  // namespace
}  // namespace fathom::server
