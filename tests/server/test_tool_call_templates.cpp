// Round trips through a real chat template: an assistant message with tool calls is rendered by
// Qwen3's template (hermes; checked in), its assistant turn is read back by the reasoning and
// tool-call parsers, and the calls come back equal. The Qwen3.5 and Qwen3-Coder templates
// (qwen3_coder) are in test_tool_call_templates_snapshot.cpp, built only where the snapshot exists.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "tool_call_template_util.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
using namespace testing_util;

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


}  // namespace
}  // namespace fathom::server
