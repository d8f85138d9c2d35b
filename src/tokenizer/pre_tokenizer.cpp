#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace fathom::tok {

SplitBehavior parse_split_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("unsupported split behavior '", s, "' in tokenizer.json");
}

void apply_split_behavior(std::string_view piece, const std::vector<Match>& m, SplitBehavior b,
                          std::vector<std::string_view>& out) {
  auto emit = [&](size_t s, size_t e) {
    if (e > s) out.push_back(piece.substr(s, e - s));
  };
  switch (b) {
    case SplitBehavior::Isolated:
      for (const auto& x : m) emit(x.start, x.end);
      return;
    case SplitBehavior::Removed:
      for (const auto& x : m)
        if (!x.is_match) emit(x.start, x.end);
      return;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      // Fold left: build (start, end) spans, then emit the non-empty ones.
      std::vector<std::pair<size_t, size_t>> acc;
      acc.reserve(m.size());
      bool prev = false;
      for (const auto& x : m) {
        bool merge = b == SplitBehavior::Contiguous ? (x.is_match == prev) : (x.is_match && !prev);
        if (merge && !acc.empty()) {
          acc.back().second = x.end;
        } else {
          acc.emplace_back(x.start, x.end);
        }
        prev = x.is_match;
      }
      for (auto& [s, e] : acc) emit(s, e);
      return;
    }
    case SplitBehavior::MergedWithNext: {
      std::vector<std::pair<size_t, size_t>> acc;
      acc.reserve(m.size());
      bool prev = false;
      for (size_t k = m.size(); k-- > 0;) {
        const auto& x = m[k];
        if (x.is_match && !prev && !acc.empty()) {
          acc.back().first = x.start;
        } else {
          acc.emplace_back(x.start, x.end);
        }
        prev = x.is_match;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k].first, acc[k].second);
      return;
    }
  }
}

SplitPreTokenizer::SplitPreTokenizer(const std::string& regex, SplitBehavior behavior, bool invert)
    : re_(regex), behavior_(behavior), invert_(invert) {}

void SplitPreTokenizer::split(std::string_view piece, std::vector<std::string_view>& out, PieceArena&) const {
  if (behavior_ == SplitBehavior::Isolated) {  // hot path: every match and gap, no list needed
    size_t prev = 0;
    re_.find_iter(piece, [&](size_t s, size_t e) {
      if (s > prev) out.push_back(piece.substr(prev, s - prev));
      if (e > s) out.push_back(piece.substr(s, e - s));
      prev = e;
    });
    if (prev < piece.size()) out.push_back(piece.substr(prev));
    return;
  }
  thread_local std::vector<Match> m;
  m.clear();
  size_t prev = 0;
  re_.find_iter(piece, [&](size_t s, size_t e) {
    if (s != prev) m.push_back({prev, s, invert_});
    m.push_back({s, e, !invert_});
    prev = e;
  });
  if (prev != piece.size()) m.push_back({prev, piece.size(), invert_});
  apply_split_behavior(piece, m, behavior_, out);
}

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
  if (use_regex_) re_ = std::make_unique<Regex>(kGpt2Pattern);
}

void ByteLevelPreTokenizer::split(std::string_view piece, std::vector<std::string_view>& out,
                                  PieceArena& arena) const {
  if (add_prefix_space_ && (piece.empty() || piece[0] != ' ')) {
    std::string s;
    s.reserve(piece.size() + 1);
    s += ' ';
    s += piece;
    piece = arena.store(std::move(s));
  }
  size_t first = out.size();
  if (use_regex_) {
    size_t prev = 0;
    re_->find_iter(piece, [&](size_t s, size_t e) {
      if (s > prev) out.push_back(piece.substr(prev, s - prev));
      if (e > s) out.push_back(piece.substr(s, e - s));
      prev = e;
    });
    if (prev < piece.size()) out.push_back(piece.substr(prev));
  } else if (!piece.empty()) {
    out.push_back(piece);
  }
  if (map_bytes_) {
    for (size_t k = first; k < out.size(); ++k) out[k] = arena.store(bytes_to_byte_level(out[k]));
  }
}

void DigitsPreTokenizer::split(std::string_view piece, std::vector<std::string_view>& out, PieceArena&) const {
  thread_local std::vector<Match> m;
  m.clear();
  size_t last = 0, i = 0;
  while (i < piece.size()) {
    size_t b = i;
    char32_t c = utf8_next(piece, i);
    if (is_numeric(c)) {
      if (last < b) m.push_back({last, b, false});
      m.push_back({b, i, true});
      last = i;
    }
  }
  if (piece.size() > last) m.push_back({last, piece.size(), false});
  apply_split_behavior(piece, m, individual_ ? SplitBehavior::Isolated : SplitBehavior::Contiguous, out);
}

void make_pre_tokenizers(const nlohmann::json& j, std::vector<std::unique_ptr<PreTokenizer>>& chain) {
  if (j.is_null()) return;
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) make_pre_tokenizers(p, chain);
    return;
  }
  if (type == "Split") {
    const auto& pat = j.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat.at("Regex").get<std::string>();
    } else if (pat.contains("String")) {
      regex = Regex::escape(pat.at("String").get<std::string>());
    } else {
      fail("unsupported Split pattern in tokenizer.json: ", pat.dump());
    }
    chain.push_back(std::make_unique<SplitPreTokenizer>(regex, parse_split_behavior(j.value("behavior", "Isolated")),
                                                        j.value("invert", false)));
    return;
  }
  if (type == "ByteLevel") {
    chain.push_back(std::make_unique<ByteLevelPreTokenizer>(j.value("add_prefix_space", true),
                                                            j.value("use_regex", true)));
    return;
  }
  if (type == "Digits") {
    chain.push_back(std::make_unique<DigitsPreTokenizer>(j.value("individual_digits", false)));
    return;
  }
  fail("unsupported pre_tokenizer type '", type, "' in tokenizer.json");
}

}  // namespace fathom::tok
