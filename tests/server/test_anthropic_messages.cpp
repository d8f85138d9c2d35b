// Anthropic's Messages API over chat completions (server/anthropic_messages.h): the request's
// translation to a chat body (and through parse_request), refusals naming the field, the error
// shape, and a chat response back as an Anthropic message.
#include <gtest/gtest.h>

#include "server/anthropic_messages.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

json chat_of(const json& body, bool count = false) { return translate_anthropic_request(body.dump(), count).chat_body; }

// The param of the 400 a body gets ("accepted" if none).
std::string refused(const json& body, bool count = false) {
  try {
    translate_anthropic_request(body.dump(), count);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.message;
    return e.param;
  }
  return "accepted";
}

json base() {
  return {{"model", "m"}, {"max_tokens", 16}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
}

TEST(AnthropicMessages, TranslatesSystemMessagesAndSampling) {
  json b = base();
  b["system"] = json::array({{{"type", "text"}, {"text", "Be "}}, {{"type", "text"}, {"text", "brief."}, {"cache_control", {{"type", "ephemeral"}}}}});
  b["stop_sequences"] = {"END"};
  b["temperature"] = 0.5;
  b["top_p"] = 0.9;
  b["top_k"] = 7;
  b["metadata"] = {{"user_id", "u"}};
  const json c = chat_of(b);
  EXPECT_EQ(c["messages"][0], (json{{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(c["messages"][1], (json{{"role", "user"}, {"content", "hi"}}));
  EXPECT_EQ(c["stop"], json({"END"}));
  EXPECT_EQ(c["max_tokens"], 16);
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["top_p"], 0.9);
  EXPECT_EQ(c["top_k"], 7);
  EXPECT_FALSE(c.contains("stream"));
  EXPECT_FALSE(c.contains("chat_template_kwargs"));
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 8}};
  EXPECT_EQ(chat_of(b)["chat_template_kwargs"], (json{{"enable_thinking", true}}));
  b["thinking"] = {{"type", "disabled"}};
  EXPECT_EQ(chat_of(b)["chat_template_kwargs"], (json{{"enable_thinking", false}}));
  b.erase("thinking");
  b["stream"] = true;
  const AnthropicRequest s = translate_anthropic_request(b.dump(), false);
  EXPECT_TRUE(s.stream);
  EXPECT_EQ(s.chat_body["stream_options"]["include_usage"], true);  // message_delta's output_tokens
}

TEST(AnthropicMessages, TranslatesToolUseRoundTripAndThinking) {
  json b = base();
  b["messages"] = json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "use the tool", "signature": "s"},
                                      {"type": "text", "text": "Checking."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"},
                                 {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                                  "content": [{"type": "text", "text": "timeout"}]},
                                 {"type": "text", "text": "and now?"}]}])");
  b["tools"] = json::parse(R"([{"name": "get", "description": "d", "input_schema": {"type": "object"}}])");
  const json m = chat_of(b)["messages"];
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[1]["role"], "assistant");
  EXPECT_EQ(m[1]["content"], "Checking.");
  EXPECT_EQ(m[1]["reasoning_content"], "use the tool");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get");
  EXPECT_EQ(json::parse(m[1]["tool_calls"][0]["function"]["arguments"].get<std::string>()), (json{{"city", "Oslo"}}));
  EXPECT_EQ(m[2], (json{{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "cold"}}));
  EXPECT_EQ(m[3]["content"], "Error: timeout");
  EXPECT_EQ(m[4], (json{{"role", "user"}, {"content", "and now?"}}));
  const json tools = chat_of(b)["tools"];
  EXPECT_EQ(tools[0]["function"]["parameters"], (json{{"type", "object"}}));
  EXPECT_EQ(tools[0]["function"]["description"], "d");
}

TEST(AnthropicMessages, TranslatesToolChoice) {
  json b = base();
  b["tools"] = json::parse(R"([{"name": "get", "input_schema": {"type": "object"}}])");
  auto choice = [&](const json& tc) {
    b["tool_choice"] = tc;
    return chat_of(b);
  };
  EXPECT_EQ(choice({{"type", "auto"}})["tool_choice"], "auto");
  EXPECT_EQ(choice({{"type", "any"}})["tool_choice"], "required");
  EXPECT_EQ(choice({{"type", "none"}})["tool_choice"], "none");
  EXPECT_EQ(choice({{"type", "tool"}, {"name", "get"}})["tool_choice"]["function"]["name"], "get");
  EXPECT_EQ(choice({{"type", "any"}, {"disable_parallel_tool_use", true}})["parallel_tool_calls"], false);
  b["tool_choice"] = {{"type", "some"}};
  EXPECT_EQ(refused(b), "tool_choice");
  b["tool_choice"] = {{"type", "auto"}, {"name", "get"}};
  EXPECT_EQ(refused(b), "name");
}

TEST(AnthropicMessages, RefusesWhatItDoesNotServeByName) {
  auto with = [](const char* k, json v) {
    json b = base();
    b[k] = std::move(v);
    return b;
  };
  EXPECT_EQ(refused(with("thinking", {{"type", "adaptive"}})), "thinking");
  EXPECT_EQ(refused(with("thinking", {{"type", "enabled"}})), "budget_tokens");
  EXPECT_EQ(refused(with("thinking", {{"type", "enabled"}, {"budget_tokens", 16}})), "budget_tokens");  // >= max_tokens
  EXPECT_EQ(refused(with("thinking", {{"type", "disabled"}, {"budget_tokens", 8}})), "budget_tokens");
  EXPECT_EQ(refused(with("service_tier", "auto")), "service_tier");
  EXPECT_EQ(refused(with("n", 2)), "n");  // chat's fields are not Anthropic's
  EXPECT_EQ(refused(with("metadata", {{"user_id", "u"}, {"x", 1}})), "x");
  EXPECT_EQ(refused(with("stop_sequences", "END")), "stop_sequences");
  EXPECT_EQ(refused(with("stream", "yes")), "stream");
  EXPECT_EQ(refused(with("system", json::array({{{"type", "image"}}}))), "system");
  EXPECT_EQ(refused(with("tools", json::parse(R"([{"name": "t"}])"))), "input_schema");
  EXPECT_EQ(refused(with("tools", json::parse(R"([{"type": "bash_20250124", "name": "bash"}])"))), "tools");
  EXPECT_EQ(refused(with("messages", json::array())), "messages");
  EXPECT_EQ(refused(with("messages", json::parse(R"([{"role": "system", "content": "x"}])"))), "role");
  EXPECT_EQ(refused(with("messages", json::parse(R"([{"role": "user", "content": [{"type": "image", "source": {}}]}])"))), "messages");
  EXPECT_EQ(refused(with("messages", json::parse(R"([{"role": "user", "content": "x", "name": "n"}])"))), "name");
  json no_max = base();
  no_max.erase("max_tokens");
  EXPECT_EQ(refused(no_max), "max_tokens");  // required, as Anthropic
  EXPECT_EQ(refused(with("max_tokens", 0)), "max_tokens");
  // count_tokens takes the prompt's fields only.
  json count = base();
  count.erase("max_tokens");
  EXPECT_EQ(refused(count, true), "accepted");
  EXPECT_EQ(refused(base(), true), "max_tokens");
  EXPECT_EQ(chat_of(count, true)["messages"].size(), 1u);
}

TEST(AnthropicMessages, ErrorShape) {
  EXPECT_EQ(anthropic_error_json(ApiError{400, "bad", "x", ""}),
            json::parse(R"({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})"));
  EXPECT_EQ(anthropic_error_json(ApiError{401, "k", "", ""})["error"]["type"], "authentication_error");
  EXPECT_EQ(anthropic_error_json(ApiError{404, "k", "", ""})["error"]["type"], "not_found_error");
  EXPECT_EQ(anthropic_error_json(ApiError{429, "k", "", ""})["error"]["type"], "rate_limit_error");
  EXPECT_EQ(anthropic_error_json(ApiError{503, "k", "", ""})["error"]["type"], "overloaded_error");
  EXPECT_EQ(anthropic_error_json(ApiError{500, "k", "", ""})["error"]["type"], "api_error");
}

TEST(AnthropicMessages, StopReasons) {
  json seq;
  EXPECT_EQ(anthropic_stop_reason("length", nullptr, &seq), "max_tokens");
  EXPECT_EQ(anthropic_stop_reason("tool_calls", nullptr, &seq), "tool_use");
  EXPECT_EQ(anthropic_stop_reason("stop", 151645, &seq), "end_turn");  // the model's end token
  EXPECT_TRUE(seq.is_null());
  EXPECT_EQ(anthropic_stop_reason("stop", "END", &seq), "stop_sequence");
  EXPECT_EQ(seq, "END");
}

TEST(AnthropicMessages, ChatResponseBecomesAMessage) {
  const json chat = json::parse(R"({"id": "c", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
    "stop_reason": null, "message": {"role": "assistant", "content": "Sure.", "reasoning_content": "think",
    "tool_calls": [{"id": "toolu_9", "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}]}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}})");
  const json m = anthropic_message(chat, "msg_1");
  EXPECT_EQ(m["id"], "msg_1");
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "m");
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "think");
  EXPECT_EQ(m["content"][1], (json{{"type", "text"}, {"text", "Sure."}}));
  EXPECT_EQ(m["content"][2], (json{{"type", "tool_use"}, {"id", "toolu_9"}, {"name", "get"}, {"input", {{"a", 1}}}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"], (json{{"input_tokens", 11}, {"output_tokens", 5}}));
  json named = chat;  // a forced named call ends with "stop" in chat's terms
  named["choices"][0]["finish_reason"] = "stop";
  EXPECT_EQ(anthropic_message(named, "x")["stop_reason"], "tool_use");
  json plain = json::parse(R"({"model": "m", "choices": [{"finish_reason": "stop", "stop_reason": "END",
    "message": {"role": "assistant", "content": "ab"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})");
  const json p = anthropic_message(plain, "y");
  EXPECT_EQ(p["content"], json::parse(R"([{"type": "text", "text": "ab"}])"));
  EXPECT_EQ(p["stop_reason"], "stop_sequence");
  EXPECT_EQ(p["stop_sequence"], "END");
}

}  // namespace
}  // namespace fathom::server
