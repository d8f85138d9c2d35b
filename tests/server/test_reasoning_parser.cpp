// The qwen3 reasoning parser: where reasoning ends ("</think>", or a "<tool_call>" when the
// model skips it), a leading "<think>", and streaming at every split equal to the whole split.
#include <gtest/gtest.h>

#include "server/reasoning_parser.h"
#include "server/stream_text.h"
#include "tool_call_test_util.h"

namespace fathom::server {
namespace {

ReasoningSplit streamed(const std::vector<std::string>& pieces, bool starts_in_reasoning) {
  ReasoningParser p(starts_in_reasoning);
  ReasoningSplit out;
  for (const std::string& piece : pieces) {
    std::string r, c;
    p.feed(piece, r, c);
    EXPECT_EQ(incomplete_utf8_tail(r), 0u);
    EXPECT_EQ(incomplete_utf8_tail(c), 0u);
    EXPECT_EQ(r.find("</thi"), std::string::npos);
    out.reasoning += r;
    out.content += c;
  }
  p.finish(out.reasoning, out.content);
  return out;
}

void expect_split(const std::string& text, bool starts, const std::string& reasoning, const std::string& content) {
  const ReasoningSplit whole = split_reasoning(text, starts);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  for (const auto& pieces : testing_util::splits_of(text)) {
    const ReasoningSplit s = streamed(pieces, starts);
    ASSERT_EQ(s.reasoning, reasoning) << pieces.size() << " pieces of " << text;
    ASSERT_EQ(s.content, content) << pieces.size() << " pieces of " << text;
  }
}

TEST(ReasoningParser, Splits) {
  expect_split("Let me think.\n</think>\n\nThe answer.", true, "Let me think.\n", "\n\nThe answer.");
  expect_split("<think>\nHmm \xE2\x98\x95.\n</think>\n\nYes.", false, "\nHmm \xE2\x98\x95.\n", "\n\nYes.");
  expect_split("  <think>x</think>y", false, "x", "y");
  expect_split("Plain answer, no thinking.", false, "", "Plain answer, no thinking.");
  expect_split("Cut off while thinking", true, "Cut off while thinking", "");
  expect_split("<thin", false, "", "<thin");
  expect_split("", true, "", "");
}

TEST(ReasoningParser, ToolCallEndsReasoning) {
  const std::string call = "<tool_call>\n<function=f>\n</function>\n</tool_call>";
  expect_split("I should call f.\n\n" + call, true, "I should call f.\n\n", call);
  expect_split("Think.</think>\n\nOK.\n" + call, true, "Think.", "\n\nOK.\n" + call);
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(ReasoningParser::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningParser::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningParser::prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace fathom::server
