// The byte-level matcher through its front-ends: GBNF, regex, choices.
#include <gtest/gtest.h>

#include "core/error.h"
#include "grammar/compiler.h"
#include "grammar/gbnf.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"

namespace fathom::grammar {
namespace {

using testing::byte_vocab;

std::shared_ptr<const CompiledGrammar> compile_bytes(std::shared_ptr<const Grammar> g) {
  static auto vocab = byte_vocab();
  return CompiledGrammar::compile(std::move(g), vocab);
}

// Whole match: every byte accepted and the end accepting.
bool full_match(std::shared_ptr<const Grammar> g, std::string_view s) {
  Matcher m(compile_bytes(std::move(g)));
  return m.accept_bytes(s) && m.is_accepting();
}
bool prefix_ok(std::shared_ptr<const Grammar> g, std::string_view s) {
  Matcher m(compile_bytes(std::move(g)));
  return m.accept_bytes(s);
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarGbnf, SequencesAlternationRepetition) {
  auto g = grammar_from_gbnf(R"(
    root ::= "a" ( "b" | "cd" )* "e"?   # comment
  )");
  EXPECT_TRUE(full_match(g, "a"));
  EXPECT_TRUE(full_match(g, "abcdbe"));
  EXPECT_TRUE(full_match(g, "ae"));
  EXPECT_FALSE(full_match(g, "ac"));
  EXPECT_TRUE(prefix_ok(g, "ac"));
  EXPECT_FALSE(prefix_ok(g, "ax"));
  EXPECT_FALSE(full_match(g, "aee"));
}

TEST(GrammarGbnf, CountedRepetition) {
  auto g = grammar_from_gbnf("root ::= [0-9]{2,4} \"-\" [a-z]{3} \"!\"{1,}");
  EXPECT_TRUE(full_match(g, "12-abc!"));
  EXPECT_TRUE(full_match(g, "1234-xyz!!!"));
  EXPECT_FALSE(full_match(g, "1-abc!"));
  EXPECT_FALSE(prefix_ok(g, "12345"));
  EXPECT_FALSE(full_match(g, "12-ab!"));
  EXPECT_FALSE(full_match(g, "12-abc"));
}

TEST(GrammarGbnf, RecursionAndMultiLineRules) {
  auto g = grammar_from_gbnf(R"g(
root ::= expr
expr ::= term ( [+-] term )*
term ::= num
       | "(" expr ")"
num  ::= [0-9]+
)g");
  EXPECT_TRUE(full_match(g, "1+(2-(3+40))"));
  EXPECT_TRUE(full_match(g, "((((7))))"));
  EXPECT_FALSE(full_match(g, "(1+2"));
  EXPECT_TRUE(prefix_ok(g, "(1+2"));
  EXPECT_FALSE(prefix_ok(g, "1+)"));
}

TEST(GrammarGbnf, CharClassesAndUtf8) {
  auto g = grammar_from_gbnf(R"(root ::= [^"\n]+ "\u00e9" [α-ω] "\x41" .)");
  EXPECT_TRUE(full_match(g, "xyé\xce\xb2\x41z"));  // β
  EXPECT_TRUE(full_match(g, "日本éωA€"));
  EXPECT_FALSE(full_match(g, "\"éωAz"));
  // An invalid UTF-8 byte is rejected even where any character is allowed.
  EXPECT_FALSE(prefix_ok(g, "\xff"));
  EXPECT_FALSE(prefix_ok(g, "a\xc3\x28"));
}

TEST(GrammarGbnf, Errors) {
  EXPECT_NE(error_of([] { grammar_from_gbnf("root ::= foo"); }).find("'foo' is used but not defined"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_gbnf("root ::= root \"a\" | \"b\""); }).find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_gbnf("root ::= \"a\" )"); }).find("line 1"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_gbnf("x ::= \"a\""); }).find("no rule 'root'"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_gbnf("root ::= \"a\" root"); }).find("no finite string"), std::string::npos);
}

TEST(GrammarRegex, Basics) {
  auto g = grammar_from_regex(R"(^[A-Z][a-z]+(-[A-Z][a-z]+)?\d{2,3}$)");
  EXPECT_TRUE(full_match(g, "Jean-Luc42"));
  EXPECT_TRUE(full_match(g, "Ann123"));
  EXPECT_FALSE(full_match(g, "Ann1234"));
  EXPECT_FALSE(full_match(g, "ann12"));
  auto h = grammar_from_regex(R"((cat|dog)s?|b.d|\w+@\w+\.(com|org)|x{3}|a[^a-c]*)");
  for (const char* ok : {"cat", "dogs", "b d", "bed", "me@host.org", "xxx", "axyz", "a"}) EXPECT_TRUE(full_match(h, ok)) << ok;
  for (const char* bad : {"cats s", "b\nd", "me@host.net", "xx", "ab"}) EXPECT_FALSE(full_match(h, bad)) << bad;
}

TEST(GrammarRegex, UnsupportedSyntaxIsAnError) {
  EXPECT_NE(error_of([] { grammar_from_regex("(?=a)b"); }).find("lookaround"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_regex("(a)\\1"); }).find("backreferences"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_regex("a\\bc"); }).find("unsupported escape"), std::string::npos);
  EXPECT_NE(error_of([] { grammar_from_regex("a(b"); }).find("missing ')'"), std::string::npos);
}

TEST(GrammarChoice, OneOfTheStrings) {
  auto g = grammar_from_choices({"yes", "no", "not sure"});
  EXPECT_TRUE(full_match(g, "no"));
  EXPECT_TRUE(full_match(g, "not sure"));
  EXPECT_FALSE(full_match(g, "not"));
  EXPECT_FALSE(full_match(g, "yess"));
}

TEST(GrammarMatcher, RollbackRestoresStateAndMask) {
  auto cg = compile_bytes(grammar_from_gbnf("root ::= \"[\" [0-9]+ (\",\" [0-9]+)* \"]\""));
  Matcher m(cg);
  std::vector<uint32_t> before(cg->vocab().mask_words()), after(before.size());
  ASSERT_TRUE(m.accept_bytes("["));
  ASSERT_TRUE(m.accept_token('1'));
  m.fill_next_token_bitmask(before);
  ASSERT_TRUE(m.accept_token(','));
  ASSERT_TRUE(m.accept_token('2'));
  ASSERT_TRUE(m.accept_token(']'));
  EXPECT_TRUE(m.is_accepting());
  ASSERT_TRUE(m.accept_token(256));  // the stop token
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token('1'));
  EXPECT_EQ(m.num_steps(), 6u);
  m.rollback(4);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_FALSE(m.is_accepting());
  m.fill_next_token_bitmask(after);
  EXPECT_EQ(before, after);
  EXPECT_FALSE(m.accept_token(256));  // stop only when complete
  EXPECT_FALSE(m.accept_token('x'));
  EXPECT_EQ(m.num_steps(), 2u);
  EXPECT_THROW(m.rollback(3), Error);
}

TEST(GrammarMatcher, MaskOfBytes) {
  auto cg = compile_bytes(grammar_from_regex("a[bc]|d"));
  Matcher m(cg);
  std::vector<uint32_t> w(cg->vocab().mask_words());
  m.fill_next_token_bitmask(w);
  for (uint32_t id = 0; id < 257; ++id) EXPECT_EQ(testing::allowed(w, id), id == 'a' || id == 'd') << id;
  ASSERT_TRUE(m.accept_token('a'));
  m.fill_next_token_bitmask(w);
  for (uint32_t id = 0; id < 257; ++id) EXPECT_EQ(testing::allowed(w, id), id == 'b' || id == 'c') << id;
  ASSERT_TRUE(m.accept_token('c'));
  m.fill_next_token_bitmask(w);
  for (uint32_t id = 0; id < 257; ++id) EXPECT_EQ(testing::allowed(w, id), id == 256) << id;
  EXPECT_EQ(m.shortest_completion(), "");
}

TEST(GrammarMatcher, ShortestCompletion) {
  auto cg = compile_bytes(grammar_from_gbnf("root ::= \"{\" item* \"}\"\nitem ::= \"<\" [a-z]+ \">\""));
  Matcher m(cg);
  ASSERT_TRUE(m.accept_bytes("{<ab"));
  std::string c = m.shortest_completion();
  EXPECT_EQ(c, ">}");
  ASSERT_TRUE(m.accept_bytes(c));
  EXPECT_TRUE(m.is_accepting());
}

}  // namespace
}  // namespace fathom::grammar

namespace fathom::grammar {
namespace {

TEST(GrammarCompilerCache, SpecsCompileAndRepeatFromCache) {
  GrammarCompiler compiler(testing::byte_vocab(), 2);
  auto a = compiler.compile({GrammarKind::Regex, "[ab]+", {}});
  EXPECT_EQ(a, compiler.compile({GrammarKind::Regex, "[ab]+", {}}));
  auto c = compiler.compile({GrammarKind::Choice, "", {"x", "yz"}});
  Matcher m(c);
  EXPECT_TRUE(m.accept_bytes("yz") && m.is_accepting());
  Matcher g(compiler.compile({GrammarKind::Gbnf, "root ::= \"q\"+", {}}));
  EXPECT_TRUE(g.accept_bytes("qqq") && g.is_accepting());
  Matcher o(compiler.compile({GrammarKind::JsonObject, "", {}}));
  EXPECT_TRUE(o.accept_bytes("{}") && o.is_accepting());
  EXPECT_NE(a, compiler.compile({GrammarKind::Regex, "[ab]+", {}}));  // evicted (capacity 2)
  EXPECT_THROW(compiler.compile({GrammarKind::JsonSchema, R"({"type":"array","contains":{},"maxContains":1})", {}}), Error);
}

}  // namespace
}  // namespace fathom::grammar
