#include "tokenizer/decode_stream.h"

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fathom::tok {

// Mirrors tokenizers' step_decode_stream: decode the window of ids, emit what goes past the
// previously decoded prefix unless the text ends in U+FFFD (an incomplete character).
std::optional<std::string> DecodeStream::step(uint32_t id) {
  ids_.push_back(id);
  std::string s = tok_->decode(ids_, skip_special_);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  bool ends_bad = s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
  if (s.size() > prefix_.size() && !ends_bad) {
    if (s.compare(0, prefix_.size(), prefix_) != 0) fail("DecodeStream: decoded text does not extend its prefix");
    std::string out = s.substr(prefix_.size());
    size_t new_prefix_index = ids_.size() - prefix_index_;
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
    prefix_ = tok_->decode(ids_, skip_special_);
    prefix_index_ = new_prefix_index;
    return out;
  }
  return std::nullopt;
}

}  // namespace fathom::tok
