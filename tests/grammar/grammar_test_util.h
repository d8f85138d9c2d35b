// Shared by the grammar tests, the sampling tool and the benchmark: vocabularies and a random
// constrained "model" (uniform over allowed tokens, seeded, closing the output after a while).
#pragma once
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/compiled.h"
#include "grammar/matcher.h"
#include "grammar/vocab.h"
#include "tokenizer/tokenizer.h"

namespace fathom::grammar::testing {

// 256 one-byte tokens and a stop token (id 256).
inline std::shared_ptr<const Vocabulary> byte_vocab() {
  std::vector<std::string> bytes(257);
  for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
  return std::make_shared<Vocabulary>(std::move(bytes), std::vector<uint8_t>(257, 0), std::vector<uint32_t>{256});
}

inline std::shared_ptr<const Vocabulary> tokenizer_vocab(const std::string& path, size_t padded = 0) {
  auto tok = tok::Tokenizer::from_file(path);
  std::vector<uint32_t> stops;
  for (const char* s : {"<|endoftext|>", "<|im_end|>"})
    if (auto id = tok.token_to_id(s)) stops.push_back(*id);
  return Vocabulary::from_tokenizer(tok, stops, padded);
}

inline bool allowed(const std::vector<uint32_t>& words, uint32_t id) { return (words[id >> 5] >> (id & 31)) & 1; }

struct Generation {
  std::string text;
  std::vector<uint32_t> tokens;
  bool complete = false;         // ended on a stop token
  std::vector<double> mask_us;   // time of each mask
};

// Uniform random among allowed tokens; from step close_after on, the longest allowed token
// that is a prefix of the matcher's shortest completion (so that every output ends).
class RandomModel {
 public:
  RandomModel(std::shared_ptr<const CompiledGrammar> cg, uint64_t seed) : cg_(std::move(cg)), rng_(seed) {
    const Vocabulary& v = cg_->vocab();
    for (uint32_t id : v.sorted()) by_bytes_.emplace(v.bytes(id), id);
  }

  Generation generate(size_t close_after, size_t max_tokens, size_t mask_cache = 16) {
    Matcher m(cg_, mask_cache);
    const Vocabulary& v = cg_->vocab();
    std::vector<uint32_t> words(v.mask_words());
    Generation g;
    while (g.tokens.size() < max_tokens) {
      auto t0 = std::chrono::steady_clock::now();
      m.fill_next_token_bitmask(words);
      g.mask_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      uint32_t id = g.tokens.size() >= close_after ? closing_token(m, words) : uniform_token(words);
      if (id == ~0u) break;
      if (!m.accept_token(id)) break;  // a test failure: an allowed token was rejected
      if (m.is_terminated()) {
        g.complete = true;
        break;
      }
      g.tokens.push_back(id);
      g.text += v.bytes(id);
    }
    return g;
  }

  uint32_t uniform_token(const std::vector<uint32_t>& words) {
    size_t total = 0;
    for (uint32_t w : words) total += __builtin_popcount(w);
    if (total == 0) return ~0u;
    size_t k = std::uniform_int_distribution<size_t>(0, total - 1)(rng_);
    for (size_t i = 0; i < words.size(); ++i) {
      size_t c = __builtin_popcount(words[i]);
      if (k >= c) {
        k -= c;
        continue;
      }
      uint32_t w = words[i];
      for (; k > 0; --k) w &= w - 1;
      return static_cast<uint32_t>(i * 32 + __builtin_ctz(w));
    }
    return ~0u;
  }

  uint32_t closing_token(const Matcher& m, const std::vector<uint32_t>& words) {
    const Vocabulary& v = cg_->vocab();
    if (m.is_accepting()) return v.stop_ids().empty() ? ~0u : v.stop_ids()[0];
    std::string target = m.shortest_completion();
    for (size_t len = std::min<size_t>(target.size(), 24); len > 0; --len) {
      auto range = by_bytes_.equal_range(target.substr(0, len));
      for (auto it = range.first; it != range.second; ++it)
        if (allowed(words, it->second)) return it->second;
    }
    return uniform_token(words);
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::shared_ptr<const CompiledGrammar> cg_;
  std::mt19937_64 rng_;
  std::unordered_multimap<std::string, uint32_t> by_bytes_;
};

}  // namespace fathom::grammar::testing
