// Unit tests for each tokenizer component, HF-checked synthetic variants (Split behaviours, Digits,
// added-token flags, normalizers, TemplateProcessing, merges formats), and errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace fathom::tok::testing {
namespace {

std::vector<std::string> split_all(const PreTokenizer& p, std::string_view s) {
  PieceArena arena;
  std::vector<std::string_view> out;
  p.split(s, out, arena);
  return {out.begin(), out.end()};
}

TEST(Unicode, Utf8LossyMatchesRust) {
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("a\xF0\x9F\xA6"), "a\xEF\xBF\xBD");                  // truncated 4-byte: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");            // two invalid bytes
  EXPECT_EQ(utf8_lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: per byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80x"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx");  // surrogate
  EXPECT_TRUE(utf8_valid("\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(utf8_valid("\xF4\x90\x80\x80"));
}

TEST(Unicode, Properties) {
  EXPECT_TRUE(is_white_space(0x85));
  EXPECT_TRUE(is_white_space(0x3000));
  EXPECT_FALSE(is_white_space(0x200B));
  EXPECT_TRUE(is_numeric(U'٣'));
  EXPECT_TRUE(is_numeric(U'½'));
  EXPECT_FALSE(is_numeric(U'a'));
}

TEST(Normalizer, UnicodeForms) {
  EXPECT_EQ(unicode_normalize("e\xCC\x81", UnicodeNormalizer::Form::NFC), "\xC3\xA9");
  EXPECT_EQ(unicode_normalize("\xC3\xA9", UnicodeNormalizer::Form::NFD), "e\xCC\x81");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", UnicodeNormalizer::Form::NFKC), "fi");
  UnicodeNormalizer nfc(UnicodeNormalizer::Form::NFC);
  std::string s = "caf\x65\xCC\x81 \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB";  // cafe + U+0301, NFD Hangul
  nfc.normalize(s);
  EXPECT_EQ(s, "caf\xC3\xA9 \xED\x95\x9C");
  EXPECT_EQ(make_normalizer(nlohmann::json()), nullptr);
  EXPECT_EQ(make_normalizer(nlohmann::json::parse(R"({"type":"Sequence","normalizers":[]})")), nullptr);
}

TEST(Regex, TranslatesWhitespaceToOniguruma) {
  EXPECT_EQ(Regex::translate("a\\sb"), std::string("a[") + "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-"
                                           "\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]b");
  Regex re("\\s+(?!\\S)|\\s+");
  std::vector<std::pair<size_t, size_t>> m;
  re.find_iter("a\xC2\x85\xC2\x85 b", [&](size_t s, size_t e) { m.emplace_back(s, e); });
  ASSERT_EQ(m.size(), 2u);  // U+0085 is whitespace, as in Oniguruma
  EXPECT_EQ(m[0], std::make_pair(size_t(1), size_t(5)));
  EXPECT_THROW(Regex("(unclosed"), Error);
}

TEST(PreTokenizer, SplitBehaviours) {
  auto pieces = [](const char* beh, bool invert, const char* text) {
    SplitPreTokenizer p("-", parse_split_behavior(beh), invert);
    return split_all(p, text);
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Removed", false, "a-b--c-"), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces("Isolated", false, "a-b--c-"), (V{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(pieces("MergedWithPrevious", false, "a-b--c-"), (V{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(pieces("MergedWithNext", false, "a-b--c-"), (V{"a", "-b", "-", "-c", "-"}));
  EXPECT_EQ(pieces("Contiguous", false, "a-b--c-"), (V{"a", "-", "b", "--", "c", "-"}));
  EXPECT_EQ(pieces("Removed", true, "a-b--c-"), (V{"-", "-", "-", "-"}));
}

TEST(PreTokenizer, ByteLevelAndDigits) {
  ByteLevelPreTokenizer bl(true, true);
  bl.set_map_bytes(false);
  EXPECT_EQ(split_all(bl, "Hello world's  x"), (std::vector<std::string>{" Hello", " world", "'s", " ", " x"}));
  ByteLevelPreTokenizer mapped(false, false);
  EXPECT_EQ(split_all(mapped, "a b\n"), (std::vector<std::string>{"a\xC4\xA0" "b\xC4\x8A"}));
  DigitsPreTokenizer ind(true), contig(false);
  EXPECT_EQ(split_all(ind, "a123b"), (std::vector<std::string>{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(split_all(contig, "a123b4"), (std::vector<std::string>{"a", "123", "b", "4"}));
}

TEST(ByteLevel, AlphabetRoundTrip) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string mapped = bytes_to_byte_level(all), back;
  ASSERT_TRUE(byte_level_to_bytes(mapped, back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(bytes_to_byte_level(" "), "\xC4\xA0");  // Ġ
  EXPECT_FALSE(byte_level_to_bytes("\xE2\x96\x81", back));  // ▁ is not in the alphabet
}

TEST(Bpe, MergesInBothFormatsAndIgnoreMerges) {
  auto model = nlohmann::json::parse(R"({"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5,"cab":6},
      "merges":["a b","ab c"]})");
  BpeModel m(model);
  std::vector<uint32_t> out;
  m.tokenize("abcab", out);
  EXPECT_EQ(out, (std::vector<uint32_t>{5, 3}));
  model["merges"] = nlohmann::json::parse(R"([["b","c"],["a","b"]])");
  BpeModel m2(model);
  out.clear();
  m2.tokenize("abc", out);
  EXPECT_EQ(out, (std::vector<uint32_t>{0, 4}));  // "b c" ranks first
  out.clear();
  m2.tokenize("cab", out);
  EXPECT_EQ(out, (std::vector<uint32_t>{2, 3}));  // "cab" is in the vocab but not reachable by merges
  model["ignore_merges"] = true;
  BpeModel m3(model);
  out.clear();
  m3.tokenize("cab", out);
  EXPECT_EQ(out, (std::vector<uint32_t>{6}));
  // A long word goes through the heap-based merge loop and agrees with the short one.
  std::string longw(300, 'a');
  for (size_t k = 1; k < longw.size(); k += 3) longw[k] = 'b';
  out.clear();
  m.tokenize(longw, out);
  std::vector<uint32_t> pieces;
  for (size_t k = 0; k < 300; k += 60) m.tokenize(longw.substr(k, 60), pieces);
  EXPECT_EQ(out, pieces);
  model["merges"] = nlohmann::json::parse(R"(["a x"])");
  EXPECT_THROW(BpeModel{model}, Error);
}

// Each synthetic variant was encoded by HF tokenizers in tools/make_tokenizer_corpus.py.
TEST(SyntheticVariants, MatchHF) {
  auto syn = read_json(fixtures_dir() + "/synthetic.json");
  auto strings = syn["strings"].get<std::vector<std::string>>();
  ASSERT_GE(syn["variants"].size(), 20u);
  for (const auto& v : syn["variants"]) {
    auto j = syn["base"];
    for (auto& [k, val] : v["override"].items()) j[k] = val;
    std::string name = v["name"];
    auto tok = Tokenizer::from_json_string(j.dump(), name);
    auto want = v["expected"].get<std::vector<std::vector<uint32_t>>>();
    size_t failed = 0;
    for (size_t i = 0; i < strings.size(); ++i) {
      auto got = tok.encode(strings[i], true);
      if (got != want[i] && ++failed <= 3)
        ADD_FAILURE() << name << ": \"" << escape(strings[i]) << "\"\n  hf:     " << ids_str(want[i])
                      << "\n  fathom: " << ids_str(got);
    }
    EXPECT_EQ(failed, 0u) << name;
  }
}

std::string error_of(const std::string& key, const std::string& value_json) {
  auto syn = read_json(fixtures_dir() + "/synthetic.json");
  auto j = syn["base"];
  j[key] = nlohmann::json::parse(value_json);
  try {
    Tokenizer::from_json_string(j.dump(), "tokenizer.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Errors, UnsupportedComponentsAreNamed) {
  EXPECT_NE(error_of("pre_tokenizer", R"({"type":"Metaspace","replacement":"_","prepend_scheme":"always"})")
                .find("unsupported pre_tokenizer type 'Metaspace' in tokenizer.json"),
            std::string::npos);
  EXPECT_NE(error_of("normalizer", R"({"type":"Lowercase"})").find("unsupported normalizer type 'Lowercase'"),
            std::string::npos);
  EXPECT_NE(error_of("decoder", R"({"type":"WordPiece","prefix":"##"})").find("unsupported decoder type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of("post_processor", R"({"type":"Weird"})").find("unsupported post_processor type 'Weird'"),
            std::string::npos);
  EXPECT_NE(error_of("model", R"({"type":"WordPiece","vocab":{}})").find("unsupported model type 'WordPiece'"),
            std::string::npos);
  EXPECT_NE(error_of("pre_tokenizer", R"({"type":"Sequence","pretokenizers":[{"type":"Whitespace"}]})")
                .find("'Whitespace'"),
            std::string::npos);
}

TEST(Errors, BadInputAndPaths) {
  const auto& tok = get_tokenizer("qwen3");
  EXPECT_THROW(tok.encode("ok\xFF", false), Error);
  EXPECT_THROW(Tokenizer::from_dir("/nonexistent/dir"), Error);
  EXPECT_THROW(Tokenizer::from_json_string("{not json"), Error);
  auto t = Tokenizer::from_dir(real_tokenizer_dir("deepseek_v3") + "/tokenizer.json");  // a file works too
  EXPECT_EQ(t.token_to_id("<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"), 0u);
}

}  // namespace
}  // namespace fathom::tok::testing
