// Helpers of the tool-call round trips through chat templates: the tools and calls rendered, the
// assistant turn of a rendering, and the check that parsing the turn gives the calls back.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "chat/chat_template.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tool_call_test_util.h"

namespace fathom::server::testing_util {

inline const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "write_file", "description": "Writes a file.",
      "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"},
        "overwrite": {"type": "boolean"}, "scale": {"type": "number"},
        "meta": {"type": "object"}, "lines": {"type": "array"}, "digits": {"type": "string"}},
      "required": ["path"]}}},
    {"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
  ])");
  return t;
}

// Arguments as objects (the request parser turns OpenAI's strings into these for templates).
inline const json& calls() {
  static const json c = json::parse(R"([
    {"type": "function", "function": {"name": "write_file", "arguments": {
      "path": "/tmp/a b.txt", "content": "line one\n  line two\twith tab \"quoted\" <b>\n\nend\n",
      "mode": 420, "overwrite": true, "scale": 2.5, "meta": {"owner": "me", "tags": ["x", 1, null], "nested": {"k": false}},
      "lines": [1, 2.25, "three", {"four": 4}], "digits": "007"}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "S\u00e3o Paulo", "days": 3}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": -1}}}
  ])");
  return c;
}

// The text of the last assistant turn of a rendering.
inline std::string assistant_turn(const std::string& rendered) {
  const std::string open = "<|im_start|>assistant\n";
  const size_t at = rendered.rfind(open);
  EXPECT_NE(at, std::string::npos) << rendered;
  const size_t from = at + open.size(), end = rendered.find("<|im_end|>", from);
  return rendered.substr(from, end - from);
}

inline std::string render_turn(const chat::ChatTemplate& t, const std::string& content, const json& tool_calls,
                        const std::string& reasoning = "") {
  json msgs = json::array({{{"role", "user"}, {"content", "Do it."}}});
  json a = {{"role", "assistant"}, {"content", content}, {"tool_calls", tool_calls}};
  if (!reasoning.empty()) a["reasoning_content"] = reasoning;
  msgs.push_back(a);
  return assistant_turn(t.render(msgs, tools(), false));
}

// Parses the turn (reasoning first) and checks it against what was rendered.
inline void expect_round_trip(const std::string& turn, ToolCallFormat format, const std::string& content,
                       const json& tool_calls, const std::string& reasoning = "") {
  SCOPED_TRACE(turn);
  const ReasoningSplit split = split_reasoning(turn, false);
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \n"));
    s.erase(s.find_last_not_of(" \n") + 1);
    return s;
  };
  EXPECT_EQ(trim(split.reasoning), reasoning);
  const ToolCallParse r = parse_tool_calls(split.content, format, tools(), seeded_tool_call_ids(1));
  EXPECT_EQ(trim(r.content), content);
  ASSERT_EQ(r.calls.size(), tool_calls.size());
  for (size_t i = 0; i < r.calls.size(); ++i) {
    EXPECT_EQ(r.calls[i].name, tool_calls[i]["function"]["name"]);
    const json args = json::parse(r.calls[i].arguments);
    EXPECT_EQ(args, tool_calls[i]["function"]["arguments"]) << r.calls[i].arguments;
  }
  expect_streaming_matches(split.content, format, tools(), content.find('<') == std::string::npos);
}

}  // namespace fathom::server::testing_util
