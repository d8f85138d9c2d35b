// Helpers of the tool-call parser tests: streaming a text in given pieces and checking each
// delta, and comparing the assembled result with the whole-output parse.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "server/stream_text.h"
#include "server/tool_call_parser.h"

namespace fathom::server::testing_util {

using json = nlohmann::ordered_json;

// The text cut at the given increasing offsets.
inline std::vector<std::string> cut(const std::string& text, const std::vector<size_t>& at) {
  std::vector<std::string> pieces;
  size_t from = 0;
  for (size_t a : at) {
    pieces.push_back(text.substr(from, a - from));
    from = a;
  }
  pieces.push_back(text.substr(from));
  return pieces;
}

// Splits to try: every single cut, every byte alone, and random multi-cuts from a fixed seed.
inline std::vector<std::vector<std::string>> splits_of(const std::string& text, uint64_t seed = 7) {
  std::vector<std::vector<std::string>> out;
  for (size_t k = 0; k <= text.size(); ++k) out.push_back(cut(text, {k}));
  std::vector<size_t> all;
  for (size_t k = 1; k < text.size(); ++k) all.push_back(k);
  out.push_back(cut(text, all));
  std::mt19937_64 rng(seed);
  for (int r = 0; r < 24 && text.size() > 1; ++r) {
    std::vector<size_t> at;
    for (size_t k = 1; k < text.size(); ++k)
      if (rng() % 5 == 0) at.push_back(k);
    out.push_back(cut(text, at));
  }
  return out;
}

// Streams the pieces, checking each delta's shape, and returns the assembled result. When
// `content_has_no_tag`, no content delta may hold '<' (the content is known to hold none, so any
// '<' would be leaked tag text).
inline ToolCallParse stream(const std::vector<std::string>& pieces, ToolCallFormat format, const json& tools,
                            uint64_t seed, bool content_has_no_tag) {
  ToolCallStreamParser parser(format, tools, seeded_tool_call_ids(seed));
  ToolCallParse out;
  auto take = [&](const ToolCallStreamDelta& d) {
    if (content_has_no_tag) {
      EXPECT_EQ(d.content.find('<'), std::string::npos) << "leaked: " << d.content;
    }
    EXPECT_EQ(d.content.find("<tool_call"), std::string::npos);
    out.content += d.content;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (!c.id.empty()) {
        EXPECT_EQ(c.index, int(out.calls.size()));
        EXPECT_FALSE(c.name.empty());
        out.calls.push_back({c.id, c.name, ""});
      } else {
        EXPECT_TRUE(c.name.empty());
        EXPECT_EQ(c.index, int(out.calls.size()) - 1);
      }
      EXPECT_EQ(incomplete_utf8_tail(c.arguments), 0u) << "a piece ends inside a character";
      if (!out.calls.empty()) out.calls.back().arguments += c.arguments;
    }
  };
  for (const std::string& p : pieces) take(parser.feed(p));
  take(parser.finish());
  EXPECT_EQ(parser.calls(), int(out.calls.size()));
  return out;
}

inline void expect_same(const ToolCallParse& want, const ToolCallParse& got, const std::string& where) {
  EXPECT_EQ(want.content, got.content) << where;
  ASSERT_EQ(want.calls.size(), got.calls.size()) << where;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(want.calls[i].id, got.calls[i].id) << where;
    EXPECT_EQ(want.calls[i].name, got.calls[i].name) << where;
    EXPECT_EQ(want.calls[i].arguments, got.calls[i].arguments) << where;
  }
}

// Every split of `text` streams to what parse_tool_calls gives.
inline void expect_streaming_matches(const std::string& text, ToolCallFormat format, const json& tools,
                                     bool content_has_no_tag = true) {
  const ToolCallParse whole = parse_tool_calls(text, format, tools, seeded_tool_call_ids(1));
  size_t n = 0;
  for (const auto& pieces : splits_of(text)) {
    const ToolCallParse got = stream(pieces, format, tools, 1, content_has_no_tag);
    expect_same(whole, got, "split #" + std::to_string(n++) + " of " + std::to_string(pieces.size()) + " pieces");
    if (::testing::Test::HasFailure()) return;  // one failing split says enough
  }
}

}  // namespace fathom::server::testing_util
