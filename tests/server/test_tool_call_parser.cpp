// The tool-call parsers on hand-written outputs (no template needed): both formats, typed
// parameters, content around and between calls, malformed blocks kept as content, and
// streaming at every split equal to the whole-output parse.
#include <gtest/gtest.h>

#include "server/tool_arguments.h"
#include "server/tool_call_parser.h"
#include "tool_call_test_util.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
using testing_util::expect_streaming_matches;
constexpr auto kCoder = ToolCallFormat::kQwen3Coder;
constexpr auto kHermes = ToolCallFormat::kHermes;

const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "ratio": {"type": "number"}, "options": {"type": "object"}, "tags": {"type": "array"},
      "note": {"type": ["string", "null"]}, "limit": {"type": ["integer", "null"]}, "free": {}}}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
  ])");
  return t;
}

ToolCallParse parse(const std::string& text, ToolCallFormat f) {
  return parse_tool_calls(text, f, tools(), seeded_tool_call_ids(1));
}

json args_of(const ToolCall& c) { return json::parse(c.arguments); }

TEST(ToolCallParser, FormatNames) {
  EXPECT_EQ(tool_call_format_from_name("qwen3_coder"), kCoder);
  EXPECT_EQ(tool_call_format_from_name("hermes"), kHermes);
  EXPECT_FALSE(tool_call_format_from_name("qwen3_xml").has_value());
}

TEST(ToolCallParser, Ids) {
  auto a = seeded_tool_call_ids(5), b = seeded_tool_call_ids(5);
  const std::string id = a();
  EXPECT_EQ(id, b());
  EXPECT_NE(id, a());
  ASSERT_EQ(id.size(), 29u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  for (char c : id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  auto r = random_tool_call_ids();
  EXPECT_NE(r(), r());
}

const std::string kCoderOne =
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

TEST(ToolCallParser, CoderSingleCall) {
  const ToolCallParse r = parse(kCoderOne, kCoder);
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "New York", "days": 3})");
  EXPECT_EQ(r.calls[0].id.substr(0, 5), "call_");
}

TEST(ToolCallParser, CoderParameterTypes) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\n  two\nlines \"quoted\"\n\n</parameter>\n"
      "<parameter=days>\n 12 \n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
      "<parameter=ratio>\n2.5\n</parameter>\n<parameter=options>\n{\"a\": [1, 2], \"b\": {\"c\": null}}\n</parameter>\n"
      "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n"
      "<parameter=limit>\nnull\n</parameter>\n<parameter=free>\n[1, 2]\n</parameter>\n"
      "<parameter=unlisted>\nplain words\n</parameter>\n</function>\n</tool_call>";
  const ToolCallParse r = parse(text, kCoder);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(r.content, "");
  const json a = args_of(r.calls[0]);
  EXPECT_EQ(a["city"], "  two\nlines \"quoted\"\n");  // one newline off each end, the rest verbatim
  EXPECT_EQ(a["days"], 12);
  EXPECT_EQ(a["metric"], true);
  EXPECT_EQ(a["ratio"], 2.5);
  EXPECT_EQ(a["options"], json::parse(R"({"a": [1, 2], "b": {"c": null}})"));
  EXPECT_EQ(a["tags"], json::parse(R"(["x", "y"])"));
  EXPECT_EQ(a["note"], "null");  // a string type keeps the text
  EXPECT_TRUE(a["limit"].is_null());
  EXPECT_EQ(a["free"], json::parse("[1, 2]"));  // no type: JSON when it parses
  EXPECT_EQ(a["unlisted"], "plain words");      // else the text
  expect_streaming_matches(text, kCoder, tools());
}

TEST(ToolCallParser, ConvertParameterFallsBackToText) {
  EXPECT_EQ(convert_parameter("abc", ParamKind::kInteger), "abc");
  EXPECT_EQ(convert_parameter("1.5", ParamKind::kInteger), 1.5);
  EXPECT_EQ(convert_parameter("yes", ParamKind::kBoolean), "yes");
  EXPECT_EQ(convert_parameter("FALSE", ParamKind::kBoolean), false);
  EXPECT_EQ(convert_parameter("{bad", ParamKind::kJson), "{bad");
  EXPECT_TRUE(convert_parameter("None", ParamKind::kNull).is_null());
  EXPECT_EQ(convert_parameter(" 7 ", ParamKind::kString), " 7 ");
  EXPECT_EQ(convert_parameter(std::string(100, '[') + std::string(100, ']'), ParamKind::kJson),
            std::string(100, '[') + std::string(100, ']'));  // too deep to be taken as JSON
  EXPECT_EQ(dump_argument(json("a\"b\n\x01")), R"("a\"b\n\u0001")");
}

TEST(ToolCallParser, SchemaLookup) {
  EXPECT_EQ(parameter_kind(find_parameter_schema(tools(), "get_weather", "days")), ParamKind::kInteger);
  EXPECT_EQ(parameter_kind(find_parameter_schema(tools(), "get_weather", "note")), ParamKind::kString);
  EXPECT_EQ(parameter_kind(find_parameter_schema(tools(), "get_weather", "limit")), ParamKind::kInteger);
  EXPECT_EQ(find_parameter_schema(tools(), "nope", "days"), nullptr);
  EXPECT_EQ(find_parameter_schema(nullptr, "get_weather", "days"), nullptr);
  const json bare = json::parse(R"([{"name": "f", "parameters": {"properties": {"x": {"type": "bool"}}}}])");
  EXPECT_EQ(parameter_kind(find_parameter_schema(bare, "f", "x")), ParamKind::kBoolean);
}

const std::string kCoderMany =
    "I'll look up both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>\n"
    "Then a note between.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "<parameter=metric>\nfalse\n</parameter>\n</function>\n</tool_call>\n  And after. ";

TEST(ToolCallParser, CoderSeveralCallsAndContentBetween) {
  const ToolCallParse r = parse(kCoderMany, kCoder);
  EXPECT_EQ(r.content, "I'll look up both.\n\nThen a note between.\n\nAnd after. ");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "noop");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[2].arguments, R"({"city": "Rome", "metric": false})");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
  expect_streaming_matches(kCoderMany, kCoder, tools());
}

const std::string kHermesMany =
    "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n"
    "</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}, \"name\": \"noop\"}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"noop\"}\n</tool_call>";

TEST(ToolCallParser, HermesCalls) {
  const ToolCallParse r = parse(kHermesMany, kHermes);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": 2})");  // as written
  EXPECT_EQ(r.calls[1].name, "noop");                                  // arguments before the name
  EXPECT_EQ(args_of(r.calls[1]), json::parse(R"({"x": [1, {"y": "}"}]})"));
  EXPECT_EQ(r.calls[2].arguments, "{}");  // no arguments
  expect_streaming_matches(kHermesMany, kHermes, tools());
}

TEST(ToolCallParser, NoCallsIsContentVerbatim) {
  for (const std::string text : {"", "  \n", "Hello, world.\n\n", "a < b and 2 > 1; </tool_call> <tool", "<think>x"}) {
    for (auto f : {kCoder, kHermes}) {
      const ToolCallParse r = parse(text, f);
      EXPECT_EQ(r.content, text);
      EXPECT_TRUE(r.calls.empty());
      expect_streaming_matches(text, f, tools(), /*content_has_no_tag=*/false);
    }
  }
}

TEST(ToolCallParser, Utf8SplitInsideCharacters) {
  const std::string text = "Caf\xC3\xA9 \xE2\x98\x95 \xF0\x9F\x98\x80\n<tool_call>\n<function=get_weather>\n"
                           "<parameter=city>\nS\xC3\xA3o Paulo \xF0\x9F\x8C\x86\n</parameter>\n</function>\n</tool_call>";
  const ToolCallParse r = parse(text, kCoder);
  EXPECT_EQ(r.content, "Caf\xC3\xA9 \xE2\x98\x95 \xF0\x9F\x98\x80");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(args_of(r.calls[0])["city"], "S\xC3\xA3o Paulo \xF0\x9F\x8C\x86");
  expect_streaming_matches(text, kCoder, tools());  // checks no piece ends inside a character
  const std::string h = "\xE2\x98\x95<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"\xE2\x98\x95\"}}</tool_call>";
  expect_streaming_matches(h, kHermes, tools());
}

TEST(ToolCallParser, StringValuesThatLookLikeTags) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\na </para b\n</function> <tool_call> x\n\n"
      "</parameter>\n</function>\n</tool_call>";
  const ToolCallParse r = parse(text, kCoder);
  ASSERT_EQ(r.calls.size(), 1u) << r.content;
  EXPECT_EQ(args_of(r.calls[0])["city"], "a </para b\n</function> <tool_call> x\n");
  expect_streaming_matches(text, kCoder, tools());
}

// Malformed blocks come back as content, as written; whatever follows still parses.
TEST(ToolCallParser, MalformedIsContent) {
  const std::string good = "<tool_call>\n<function=noop>\n</function>\n</tool_call>";
  const std::vector<std::pair<ToolCallFormat, std::string>> bad = {
      {kCoder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"},  // unclosed
      {kCoder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>"},
      {kCoder, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"},  // the other format
      {kCoder, "<tool_call>garbage</tool_call>"},
      {kCoder, "<tool_call>\n<function=>\n</function>\n</tool_call>"},
      {kCoder, "<tool_call>\n<function=a\nb>\n</function>\n</tool_call>"},
      {kCoder, "<tool_call>\n<function=noop>\n</function>\ntrailing\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"arguments\": {}}\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} extra\n</tool_call>"},
      {kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n"},  // unclosed
      {kHermes, "<tool_call>\n[1, 2]\n</tool_call>"},
      {kHermes, "<tool_call></tool_call>"},
      {kHermes, "<tool_call><tool_call></tool_call>"},
  };
  for (const auto& [f, text] : bad) {
    ToolCallParse r;
    ASSERT_NO_THROW(r = parse(text, f)) << text;
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    const bool closed = text.find("</tool_call>") != std::string::npos;
    if (!closed) continue;  // streaming may have sent the call's name already (see the header)
    const std::string hermes_good = "<tool_call>{\"name\": \"noop\", \"arguments\": {}}</tool_call>";
    const std::string both = "before " + text + " mid " + (f == kCoder ? good : hermes_good) + " after";
    r = parse(both, f);
    EXPECT_EQ(r.content, "before " + text + " mid\n\nafter") << both;
    EXPECT_EQ(r.calls.size(), 1u) << both;
  }
}

TEST(ToolCallParser, MalformedStreamingAndGarbageNeverThrow) {
  std::mt19937_64 rng(11);
  const std::string alphabet = "<>/=\n {}\":,[]tool_callfunctionparameter\\nameargs\xC3\xA9";
  for (int i = 0; i < 300; ++i) {
    std::string text = i % 2 ? kCoderMany : kHermesMany;
    for (int k = 0; k < 6; ++k) text[rng() % text.size()] = alphabet[rng() % alphabet.size()];
    if (i % 3 == 0) text.resize(rng() % text.size());
    for (auto f : {kCoder, kHermes}) {
      ASSERT_NO_THROW(parse(text, f));
      ToolCallStreamParser p(f, tools(), seeded_tool_call_ids(1));
      ASSERT_NO_THROW({
        for (size_t k = 0; k < text.size(); k += 1 + rng() % 4) p.feed(text.substr(k, 1 + rng() % 4));
        p.finish();
      });
    }
  }
}

// A call cut off after its name was streamed stays a (partial) call in streaming; the whole
// parse keeps it as content.
TEST(ToolCallParser, UnclosedAfterNameWhileStreaming) {
  const std::string text = "Hi <tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  ToolCallStreamParser p(kCoder, tools(), seeded_tool_call_ids(1));
  ToolCallStreamDelta d = p.feed(text);
  EXPECT_EQ(d.content, "Hi");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Par");
  d = p.finish();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(p.calls(), 1);
  EXPECT_EQ(parse(text, kCoder).content, text);
}

TEST(ToolCallParser, StreamingShape) {
  ToolCallStreamParser p(kCoder, tools(), seeded_tool_call_ids(3));
  ToolCallStreamDelta d = p.feed("Sure.\n\n<tool_c");
  EXPECT_EQ(d.content, "Sure.");
  EXPECT_TRUE(d.tool_calls.empty());
  d = p.feed("all>\n<function=get_weather>\n");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].id, seeded_tool_call_ids(3)());
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  d = p.feed("<parameter=city>\nOs");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Os");
  d = p.feed("lo\n</param");
  EXPECT_EQ(d.tool_calls.at(0).arguments, "lo");  // the newline may end the value: held
  d = p.feed("eter>\n<parameter=days>\n1");
  EXPECT_EQ(d.tool_calls.at(0).arguments, "\", \"days\": ");  // an integer waits for its end
  d = p.feed("0\n</parameter>\n</function>\n</tool_call>");
  EXPECT_EQ(d.tool_calls.at(0).arguments, "10}");
  d = p.finish();
  EXPECT_TRUE(d.empty());
}

}  // namespace
}  // namespace fathom::server
