// Round trips through real chat templates: an assistant message with tool calls is rendered by
// the template (our Jinja, byte-identical to transformers'), its assistant turn is read back by
// the reasoning and tool-call parsers, and the calls come back equal. Qwen3's template (hermes)
// is checked in; the Qwen3.5 and Qwen3-Coder ones (qwen3_coder) are read from ../shared only.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tool_call_test_util.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

const json& tools() {
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
const json& calls() {
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
std::string assistant_turn(const std::string& rendered) {
  const std::string open = "<|im_start|>assistant\n";
  const size_t at = rendered.rfind(open);
  EXPECT_NE(at, std::string::npos) << rendered;
  const size_t from = at + open.size(), end = rendered.find("<|im_end|>", from);
  return rendered.substr(from, end - from);
}

std::string render_turn(const chat::ChatTemplate& t, const std::string& content, const json& tool_calls,
                        const std::string& reasoning = "") {
  json msgs = json::array({{{"role", "user"}, {"content", "Do it."}}});
  json a = {{"role", "assistant"}, {"content", content}, {"tool_calls", tool_calls}};
  if (!reasoning.empty()) a["reasoning_content"] = reasoning;
  msgs.push_back(a);
  return assistant_turn(t.render(msgs, tools(), false));
}

// Parses the turn (reasoning first) and checks it against what was rendered.
void expect_round_trip(const std::string& turn, ToolCallFormat format, const std::string& content,
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
  testing_util::expect_streaming_matches(split.content, format, tools(), content.find('<') == std::string::npos);
}

TEST(ToolCallTemplates, Qwen3HermesRoundTrip) {
  auto src = chat::load_chat_template(std::string(FATHOM_FIXTURES_DIR) + "/tokenizers/qwen3");
  chat::ChatTemplate t(src.source);
  const std::string turn = render_turn(t, "I'll write the file, then check the weather.", calls());
  EXPECT_NE(turn.find("<tool_call>\n{\"name\": \"write_file\""), std::string::npos) << turn;
  expect_round_trip(turn, ToolCallFormat::kHermes, "I'll write the file, then check the weather.", calls());
  expect_round_trip(render_turn(t, "", json::array({calls()[1]})), ToolCallFormat::kHermes, "",
                    json::array({calls()[1]}));
  expect_round_trip(render_turn(t, "Sure.", calls(), "The user wants a file.\nThen weather."),
                    ToolCallFormat::kHermes, "Sure.", calls(), "The user wants a file.\nThen weather.");
}

#ifdef FATHOM_SHARED_DIR
chat::ChatTemplate snapshot(const std::string& name) {
  return chat::ChatTemplate(
      chat::load_chat_template(std::string(FATHOM_SHARED_DIR) + "/fixtures/chat_templates/" + name).source);
}

TEST(ToolCallTemplates, Qwen35CoderRoundTrip) {
  const chat::ChatTemplate t = snapshot("qwen3.5");
  const std::string turn = render_turn(t, "I'll write the file, then check the weather.", calls());
  EXPECT_NE(turn.find("<parameter=overwrite>\nTrue\n</parameter>"), std::string::npos) << turn;
  expect_round_trip(turn, ToolCallFormat::kQwen3Coder, "I'll write the file, then check the weather.", calls());
  expect_round_trip(render_turn(t, "", calls()), ToolCallFormat::kQwen3Coder, "", calls());
  expect_round_trip(render_turn(t, "On it.", json::array({calls()[2]}), "Need Oslo.\n\nDays -1?"),
                    ToolCallFormat::kQwen3Coder, "On it.", json::array({calls()[2]}), "Need Oslo.\n\nDays -1?");
}

TEST(ToolCallTemplates, Qwen3CoderRoundTrip) {
  const chat::ChatTemplate t = snapshot("qwen3-coder");
  const std::string turn = render_turn(t, "Writing it now.", calls());
  EXPECT_NE(turn.find("<function=write_file>\n<parameter=path>\n/tmp/a b.txt\n</parameter>"), std::string::npos)
      << turn;
  expect_round_trip(turn, ToolCallFormat::kQwen3Coder, "Writing it now.", calls());
  expect_round_trip(render_turn(t, "", json::array({calls()[1], calls()[2]})), ToolCallFormat::kQwen3Coder, "",
                    json::array({calls()[1], calls()[2]}));
}

// Generation as the server sees it: the Qwen3.5 prompt opens <think>, so the output starts in
// the reasoning; streaming both parsers gives the same as splitting the whole output.
TEST(ToolCallTemplates, Qwen35OutputWithReasoningStreams) {
  const chat::ChatTemplate t = snapshot("qwen3.5");
  const std::string turn = render_turn(t, "Checking.", calls(), "Think first.");
  const std::string open = "<think>\n";
  ASSERT_EQ(turn.substr(0, open.size()), open);
  const std::string output = turn.substr(open.size());  // the prompt ended with "<think>\n"
  const ReasoningSplit whole = split_reasoning(output, true);
  EXPECT_EQ(whole.reasoning, "Think first.\n");
  const ToolCallParse want = parse_tool_calls(whole.content, ToolCallFormat::kQwen3Coder, tools(),
                                              seeded_tool_call_ids(1));
  ASSERT_EQ(want.calls.size(), 3u);
  for (const auto& pieces : testing_util::splits_of(output, 3)) {
    ReasoningParser rp(true);
    ToolCallStreamParser tp(ToolCallFormat::kQwen3Coder, tools(), seeded_tool_call_ids(1));
    std::string reasoning;
    ToolCallParse got;
    auto take = [&](const ToolCallStreamDelta& d) {
      got.content += d.content;
      for (const ToolCallDelta& c : d.tool_calls) {
        if (!c.id.empty()) got.calls.push_back({c.id, c.name, ""});
        got.calls.back().arguments += c.arguments;
      }
    };
    for (const std::string& p : pieces) {
      std::string content;
      rp.feed(p, reasoning, content);
      take(tp.feed(content));
    }
    std::string content;
    rp.finish(reasoning, content);
    take(tp.feed(content));
    take(tp.finish());
    EXPECT_EQ(reasoning, whole.reasoning);
    testing_util::expect_same(want, got, std::to_string(pieces.size()) + " pieces");
    if (HasFailure()) return;
  }
}
#endif

}  // namespace
}  // namespace fathom::server
