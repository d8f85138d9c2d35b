// Checks every corpus string against HF `tokenizers` ids for Qwen3, Llama 3, DeepSeek V3 and a
// Qwen3.5-regex variant, plus decode round trips and streaming decode.
#include <gtest/gtest.h>

#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decode_stream.h"
#include "tokenizer/normalizer.h"

namespace fathom::tok::testing {
namespace {

class CorpusTest : public ::testing::TestWithParam<std::string> {};

std::vector<std::vector<uint32_t>> expected_no_special(const std::string& name, const nlohmann::json& exp) {
  if (exp.contains("no_special")) return exp["no_special"].get<std::vector<std::vector<uint32_t>>>();
  auto base = read_json(fixtures_dir() + "/expected_" + exp["no_special_base"].get<std::string>() + ".json");
  auto ids = base["no_special"].get<std::vector<std::vector<uint32_t>>>();
  for (auto& [k, v] : exp["no_special_diff"].items()) ids[std::stoul(k)] = v.get<std::vector<uint32_t>>();
  (void)name;
  return ids;
}

TEST_P(CorpusTest, EncodeMatchesHF) {
  const std::string name = GetParam();
  const auto& tok = get_tokenizer(name);
  const auto& c = corpus();
  auto exp = read_json(fixtures_dir() + "/expected_" + name + ".json");
  auto want = expected_no_special(name, exp);
  ASSERT_EQ(want.size(), c.size());
  ASSERT_GE(c.size(), 2000u);
  size_t failed = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    auto got = tok.encode(c[i], false);
    if (got != want[i] && ++failed <= 5)
      ADD_FAILURE() << name << " string #" << i << " \"" << escape(c[i]) << "\"\n  hf:     " << ids_str(want[i])
                    << "\n  fathom: " << ids_str(got);
  }
  EXPECT_EQ(failed, 0u) << failed << " of " << c.size() << " strings differ";
  // add_special_tokens=True on a subset.
  auto idx = exp["special_idx"].get<std::vector<size_t>>();
  auto want_sp = exp["special"].get<std::vector<std::vector<uint32_t>>>();
  size_t failed_sp = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    auto got = tok.encode(c[idx[k]], true);
    if (got != want_sp[k] && ++failed_sp <= 5)
      ADD_FAILURE() << name << " (add_special_tokens) string #" << idx[k] << " \"" << escape(c[idx[k]])
                    << "\"\n  hf:     " << ids_str(want_sp[k]) << "\n  fathom: " << ids_str(got);
  }
  EXPECT_EQ(failed_sp, 0u);
}

TEST_P(CorpusTest, DecodeRoundTripAndStream) {
  const std::string name = GetParam();
  const auto& tok = get_tokenizer(name);
  bool nfc = name == "qwen3" || name == "qwen35";
  size_t failed = 0, stream_failed = 0;
  for (const auto& s : corpus()) {
    auto ids = tok.encode(s, false);
    std::string want = nfc ? unicode_normalize(s, UnicodeNormalizer::Form::NFC) : s;
    std::string got = tok.decode(ids, false);
    if (got != want && ++failed <= 5)
      ADD_FAILURE() << name << " decode(encode(s)) != s for \"" << escape(s) << "\": got \"" << escape(got) << "\"";
    DecodeStream ds(tok);
    std::string streamed;
    for (uint32_t id : ids) {
      if (auto piece = ds.step(id)) streamed += *piece;
    }
    // Like HF, the stream holds back text that ends in U+FFFD (it may be an incomplete character),
    // so a text that really ends in U+FFFD is only fully emitted by a later id.
    bool ok = streamed == got;
    if (!ok && got.compare(0, streamed.size(), streamed) == 0) {
      std::string rest = got.substr(streamed.size());
      ok = !rest.empty() && rest.size() % 3 == 0;
      for (size_t k = 0; ok && k < rest.size(); k += 3) ok = rest.compare(k, 3, "\xEF\xBF\xBD") == 0;
    }
    if (!ok && ++stream_failed <= 5)
      ADD_FAILURE() << name << " DecodeStream \"" << escape(streamed) << "\" != decode \"" << escape(got) << "\"";
  }
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(stream_failed, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, CorpusTest, ::testing::Values("qwen3", "llama3", "deepseek_v3", "qwen35"));

TEST(TokenizerApi, VocabAndSpecialTokens) {
  const auto& q = get_tokenizer("qwen3");
  EXPECT_EQ(q.token_to_id("<|im_start|>"), 151644u);
  EXPECT_EQ(q.id_to_token(151645), "<|im_end|>");
  EXPECT_EQ(q.token_to_id("hello"), 14990u);
  EXPECT_FALSE(q.token_to_id("definitely-not-a-token-xyz").has_value());
  EXPECT_FALSE(q.id_to_token(10'000'000).has_value());
  EXPECT_EQ(q.vocab_size(), 151669u);
  EXPECT_TRUE(q.is_special(151643));
  EXPECT_FALSE(q.is_special(*q.token_to_id("<think>")));  // an added but non-special token
  // skip_special_tokens drops <|im_start|> but keeps <think>.
  auto ids = q.encode("<|im_start|>a<think>b", false);
  EXPECT_EQ(q.decode(ids, true), "a<think>b");
  EXPECT_EQ(q.decode(ids, false), "<|im_start|>a<think>b");
  const auto& l = get_tokenizer("llama3");
  EXPECT_EQ(l.token_to_id("<|begin_of_text|>"), 128000u);
  EXPECT_EQ(l.vocab_size(), 128256u);
}

TEST(DecodeStreamTest, HoldsBackIncompleteUtf8) {
  const auto& tok = get_tokenizer("llama3");
  // An emoji whose 4 bytes are split over several byte tokens.
  auto ids = tok.encode("\xF0\x9F\xA6\x80\xF0\x9F\xA6\x80", false);
  DecodeStream ds(tok);
  std::string all;
  for (uint32_t id : ids) {
    auto out = ds.step(id);
    if (out) {
      EXPECT_EQ(out->find("\xEF\xBF\xBD"), std::string::npos);
      all += *out;
    }
  }
  EXPECT_EQ(all, "\xF0\x9F\xA6\x80\xF0\x9F\xA6\x80");
  // Byte tokens fed one by one: nothing until the character completes.
  DecodeStream ds2(tok);
  const auto& alpha = ByteLevelAlphabet::get();
  std::string crab = "\xF0\x9F\xA6\x80";
  for (size_t k = 0; k < crab.size(); ++k) {
    auto id = tok.token_to_id(alpha.byte_to_utf8[static_cast<unsigned char>(crab[k])]);
    ASSERT_TRUE(id.has_value());
    auto out = ds2.step(*id);
    if (k + 1 < crab.size()) {
      EXPECT_FALSE(out.has_value()) << k;
    } else {
      ASSERT_TRUE(out.has_value());
      EXPECT_EQ(*out, crab);
    }
  }
}

}  // namespace
}  // namespace fathom::tok::testing
