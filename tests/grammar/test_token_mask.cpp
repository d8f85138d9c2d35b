// Token masks over real vocabularies: the cached (context-independent + checked) mask, and the
// grammar's shared whole-state mask cache, equal a brute-force check of every token, constrained random generation yields valid JSON, and
// rollback restores masks.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar_test_util.h"

namespace fathom::grammar {
namespace {

const std::string kFixtures = FATHOM_FIXTURES_DIR;

std::shared_ptr<const Vocabulary> small_vocab() {
  static auto v = testing::tokenizer_vocab(kFixtures + "/tokenizers/fathom_default/tokenizer.json");
  return v;
}

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string"},"id":{"type":"integer"},"score":{"type":["number","null"]},
  "tags":{"type":"array","items":{"enum":["red","green","blue"]},"maxItems":3},
  "address":{"type":"object","properties":{"city":{"type":"string","maxLength":12},"zip":{"type":"string","pattern":"[0-9]{5}"}},"required":["city"]},
  "ok":{"type":"boolean"}},"required":["name","id","address"]})";

// Every token checked on its own, from the matcher's current state.
std::vector<uint32_t> brute_force_mask(Matcher& m) {
  const Vocabulary& v = m.vocab();
  std::vector<uint32_t> w(v.mask_words(), 0);
  for (uint32_t id = 0; id < v.size(); ++id) {
    bool stop = std::find(v.stop_ids().begin(), v.stop_ids().end(), id) != v.stop_ids().end();
    bool ok = stop ? m.is_accepting() : !v.is_special(id) && m.can_accept_bytes(v.bytes(id));
    if (ok) w[id >> 5] |= 1u << (id & 31);
  }
  return w;
}

TEST(GrammarTokenMask, VocabularyBytesAndTrie) {
  auto v = small_vocab();
  EXPECT_GE(v->size(), 8189u);
  EXPECT_EQ(v->stop_ids().size(), 2u);
  EXPECT_TRUE(v->is_special(8186));  // <think>: special, never grammar text
  const auto& trie = v->trie();
  EXPECT_EQ(trie[0].subtree, trie.size());
  EXPECT_EQ(trie[0].hi, v->sorted().size());
  for (size_t i = 1; i < v->sorted().size(); ++i) EXPECT_LE(v->bytes(v->sorted()[i - 1]), v->bytes(v->sorted()[i]));
  // Byte-level tokens decode through the GPT-2 alphabet: "Ġ" is a space.
  auto tok = tok::Tokenizer::from_file(kFixtures + "/tokenizers/fathom_default/tokenizer.json");
  auto ids = tok.encode(" hello world", false);
  std::string joined;
  for (uint32_t id : ids) joined += v->bytes(id);
  EXPECT_EQ(joined, " hello world");
}

TEST(GrammarTokenMask, CachedMaskEqualsBruteForce) {
  std::vector<std::shared_ptr<const Grammar>> grammars = {
      grammar_from_json_schema(kSchema), json_object_grammar(),
      grammar_from_regex(R"((\w+ ){1,4}\d{3}-[a-f]+)"),
      grammar_from_gbnf("root ::= \"<\" tag \">\" [^<]* \"</\" tag \">\"\ntag ::= [a-z]+"),
      // Ambiguous: several stacks at once, and a recursive rule in a non-tail position.
      grammar_from_gbnf("root ::= (\"a\" | \"ab\" | x)* \"b\" [ \n]?\nx ::= \"(\" root? \")\" | [a-z]{1,3}"),
      // An unanchored pattern (an ECMA search): dozens of stacks in several groups at once.
      grammar_from_json_schema(R"s({"type": "object", "properties": {"email": {"type": "string",
          "pattern": "[a-z0-9._]+@[a-z]+\\.(com|org)"}, "zip": {"type": "string", "pattern": "[0-9]{3}"}},
          "required": ["email", "zip"]})s")};
  uint64_t seed = 1;
  for (auto& g : grammars) {
    auto cg = CompiledGrammar::compile(g, small_vocab());
    for (int run = 0; run < 3; ++run) {
      testing::RandomModel model(cg, seed++);
      auto gen = model.generate(20, 120);
      // Replay the generation, comparing masks at each step: from the masks the generation left
      // in the grammar's shared cache (m), and computed afresh (uncached).
      Matcher m(cg), uncached(cg, /*mask_cache=*/0);
      std::vector<uint32_t> w(cg->vocab().mask_words()), fresh(w.size());
      for (size_t i = 0; i <= gen.tokens.size(); ++i) {
        m.fill_next_token_bitmask(w);
        uncached.fill_next_token_bitmask(fresh);
        auto bf = brute_force_mask(m);
        ASSERT_EQ(fresh, bf) << "uncached, grammar " << &g - &grammars[0] << " step " << i;
        for (uint32_t id = 0; id < cg->vocab().size(); ++id)
          if (testing::allowed(w, id) != testing::allowed(bf, id))
            ADD_FAILURE() << "token " << id << " '" << cg->vocab().bytes(id) << "' cached=" << testing::allowed(w, id);
        ASSERT_EQ(w, bf) << "grammar " << &g - &grammars[0] << " step " << i << " after '"
                                          << gen.text << "'";
        if (i < gen.tokens.size()) ASSERT_TRUE(m.accept_token(gen.tokens[i]) && uncached.accept_token(gen.tokens[i]));
      }
    }
  }
}

TEST(GrammarTokenMask, RandomGenerationIsValidJson) {
  auto cg = CompiledGrammar::compile(grammar_from_json_schema(kSchema), small_vocab());
  testing::RandomModel model(cg, 42);
  for (int i = 0; i < 100; ++i) {
    auto gen = model.generate(i % 40, 400);
    ASSERT_TRUE(gen.complete) << gen.text;
    auto j = nlohmann::json::parse(gen.text);  // throws on invalid JSON
    EXPECT_TRUE(j.contains("name") && j.contains("id") && j.contains("address")) << gen.text;
    EXPECT_TRUE(j["address"].contains("city")) << gen.text;
    EXPECT_LE(j["address"]["city"].get<std::string>().size(), 12u * 4) << gen.text;
  }
}

TEST(GrammarTokenMask, RollbackOfSpeculativeTokens) {
  auto cg = CompiledGrammar::compile(json_object_grammar(), small_vocab());
  testing::RandomModel model(cg, 7);
  Matcher m(cg);
  std::vector<uint32_t> w(cg->vocab().mask_words()), before(w.size());
  for (int step = 0; step < 60; ++step) {
    m.fill_next_token_bitmask(before);
    // Draft up to 4 tokens, reject them all, then take one.
    size_t drafted = 0;
    for (; drafted < 4; ++drafted) {
      m.fill_next_token_bitmask(w);
      uint32_t id = model.uniform_token(w);
      if (id == ~0u || !m.accept_token(id) || m.is_terminated()) {
        if (id != ~0u && m.is_terminated()) ++drafted;
        break;
      }
    }
    m.rollback(drafted);
    m.fill_next_token_bitmask(w);
    ASSERT_EQ(w, before) << "step " << step;
    uint32_t id = step < 30 ? model.uniform_token(w) : model.closing_token(m, w);
    ASSERT_TRUE(m.accept_token(id));
    if (m.is_terminated()) break;
  }
}

TEST(GrammarTokenMask, QwenVocabularyMaskEqualsBruteForce) {
  auto vocab = testing::tokenizer_vocab(kFixtures + "/tokenizers/qwen3/tokenizer.json", 151936);
  EXPECT_EQ(vocab->size(), 151936u);
  auto cg = CompiledGrammar::compile(grammar_from_json_schema(kSchema), vocab);
  testing::RandomModel model(cg, 3);
  auto gen = model.generate(10, 60);
  ASSERT_TRUE(gen.complete) << gen.text;
  Matcher m(cg);
  std::vector<uint32_t> w(vocab->mask_words());
  for (size_t i = 0; i <= gen.tokens.size(); i += 1) {
    m.fill_next_token_bitmask(w);
    if (i % 4 == 0) ASSERT_EQ(w, brute_force_mask(m)) << "step " << i << " after '" << gen.text << "'";
    if (i < gen.tokens.size()) ASSERT_TRUE(m.accept_token(gen.tokens[i]));
  }
}

}  // namespace
}  // namespace fathom::grammar

namespace fathom::grammar {
namespace {

// Context-dependent tokens deep in the trie (a long token crossing a rule end near its end), and
// a grammar with more positions than are classified eagerly.
TEST(GrammarTokenMask, LongTokensAndLazyPositions) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  bytes.push_back(std::string(100, '-') + "x");  // 256
  bytes.push_back(std::string(90, '-'));         // 257
  bytes.push_back(std::string(90, '-') + "y");   // 258
  bytes.push_back("");                           // 259: stop
  auto vocab = std::make_shared<Vocabulary>(bytes, std::vector<uint8_t>(260, 0), std::vector<uint32_t>{259});
  auto cg = CompiledGrammar::compile(grammar_from_gbnf("root ::= dashes \"x\"\ndashes ::= \"-\"*"), vocab);
  Matcher m(cg);
  std::vector<uint32_t> w(vocab->mask_words());
  m.fill_next_token_bitmask(w);
  EXPECT_TRUE(testing::allowed(w, 256));
  EXPECT_TRUE(testing::allowed(w, 257));
  EXPECT_FALSE(testing::allowed(w, 258));
  EXPECT_EQ(w, brute_force_mask(m));

  // ~3000 positions: many are classified on first use.
  auto big = CompiledGrammar::compile(grammar_from_json_schema(R"({"type":"string","maxLength":300})"), small_vocab());
  size_t eager = big->stats().groups;
  testing::RandomModel model(big, 9);
  for (int i = 0; i < 3; ++i) {
    auto gen = model.generate(200, 1000);
    ASSERT_TRUE(gen.complete);
    auto s = nlohmann::json::parse(gen.text).get<std::string>();
    size_t chars = 0;
    for (unsigned char c : s) chars += (c & 0xC0) != 0x80;
    EXPECT_LE(chars, 300u);
    Matcher replay(big);
    for (size_t t = 0; t < gen.tokens.size(); t += 37) {
      while (replay.num_steps() < t) ASSERT_TRUE(replay.accept_token(gen.tokens[replay.num_steps()]));
      w.assign(big->vocab().mask_words(), 0);
      replay.fill_next_token_bitmask(w);
      ASSERT_EQ(w, brute_force_mask(replay)) << "step " << t;
    }
  }
  EXPECT_GT(big->stats().groups, eager);
}

}  // namespace
}  // namespace fathom::grammar

#include <thread>

namespace fathom::grammar {
namespace {

// One compiled grammar shared by sequences on several threads, with groups classified lazily
// while they run.
TEST(GrammarTokenMask, SharedAcrossThreads) {
  auto cg = CompiledGrammar::compile(
      grammar_from_json_schema(R"({"type":"array","items":{"type":"string","maxLength":200},"maxItems":3})"),
      small_vocab());
  std::vector<std::string> failures(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      testing::RandomModel model(cg, 100 + t);
      for (int i = 0; i < 5; ++i) {
        auto gen = model.generate(150, 2000);
        try {
          if (!gen.complete || !nlohmann::json::parse(gen.text).is_array()) failures[t] = gen.text;
        } catch (const std::exception& e) {
          failures[t] = e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
}

}  // namespace
}  // namespace fathom::grammar
