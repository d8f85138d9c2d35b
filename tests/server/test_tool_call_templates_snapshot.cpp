// Round trips through the snapshot chat templates (Qwen3.5 and Qwen3-Coder, qwen3_coder form),
// read from ../shared, which the repository must not copy: tests/CMakeLists.txt builds this file
// only where ../shared exists (FATHOM_SHARED_DIR).
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tool_call_template_util.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
using namespace testing_util;

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
  for (const auto& pieces : splits_of(output, 3)) {
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
    expect_same(want, got, std::to_string(pieces.size()) + " pieces");
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace fathom::server
