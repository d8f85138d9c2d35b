// Pre-tokenizers from tokenizer.json: Split (regex or string), ByteLevel, Digits, Sequence.
// Each splits one piece of text into sub-pieces exactly as HF tokenizers does; pieces are views
// into the input or into an arena of new strings (a prepended space, byte-level mapping).
#pragma once
#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace fathom::tok {

// Storage for pieces whose text is not a slice of the input. Addresses stay valid until clear().
class PieceArena {
 public:
  std::string_view store(std::string s) { return strings_.emplace_back(std::move(s)); }
  void clear() { strings_.clear(); }

 private:
  std::deque<std::string> strings_;
};

// HF SplitDelimiterBehavior.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const std::string& s);

struct Match {
  size_t start, end;
  bool is_match;
};
// Applies a behaviour to the (offset, is_match) list of one piece and appends the non-empty
// resulting slices of `piece` to out.
void apply_split_behavior(std::string_view piece, const std::vector<Match>& matches, SplitBehavior b,
                          std::vector<std::string_view>& out);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Appends the non-empty sub-pieces of `piece` to out.
  virtual void split(std::string_view piece, std::vector<std::string_view>& out, PieceArena& arena) const = 0;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& regex, SplitBehavior behavior, bool invert);
  void split(std::string_view piece, std::vector<std::string_view>& out, PieceArena& arena) const override;

 private:
  Regex re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  void split(std::string_view piece, std::vector<std::string_view>& out, PieceArena& arena) const override;
  // When false (ByteLevel is the last pre-tokenizer), pieces stay raw bytes and the BPE model maps
  // bytes to ids directly; when true they are mapped to the byte-level alphabet here.
  void set_map_bytes(bool m) { map_bytes_ = m; }
  bool add_prefix_space() const { return add_prefix_space_; }

  // The GPT-2 pattern ByteLevel uses when use_regex is set.
  static constexpr const char* kGpt2Pattern =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

 private:
  bool add_prefix_space_;
  bool use_regex_;
  bool map_bytes_ = true;
  std::unique_ptr<Regex> re_;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void split(std::string_view piece, std::vector<std::string_view>& out, PieceArena& arena) const override;

 private:
  bool individual_;
};

// Appends the pre-tokenizers described by j (flattening Sequence) to chain. null adds nothing.
// Unsupported types throw fathom::Error.
void make_pre_tokenizers(const nlohmann::json& j, std::vector<std::unique_ptr<PreTokenizer>>& chain);

}  // namespace fathom::tok
