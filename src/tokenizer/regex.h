// Regex used by Split pre-tokenizers: PCRE2 with UTF, UCP and JIT. Patterns are written for
// Oniguruma (what HF tokenizers uses), so `\s`/`\S` are rewritten to Oniguruma's White_Space set.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace fathom::tok {

class Regex {
 public:
  // Compiles an Oniguruma-syntax pattern; throws fathom::Error naming the pattern on failure.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(start, end) for every non-overlapping match, left to right, like onig's find_iter
  // (an empty match right after the previous match is skipped). `text` must be valid UTF-8.
  template <class F>
  void find_iter(std::string_view text, F&& f) const {
    size_t pos = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (pos <= text.size()) {
      size_t s, e;
      if (!search(text, pos, s, e)) break;
      if (s == e && have_last && s == last_end) {
        if (pos >= text.size()) break;
        pos = next_char(text, pos);
        continue;
      }
      f(s, e);
      have_last = true;
      last_end = e;
      pos = e;
      if (s == e) {
        if (pos >= text.size()) break;
        // An empty match: the next search starts here but may not match empty here again.
      }
    }
  }

  // Escapes a literal string for use in a pattern.
  static std::string escape(std::string_view literal);
  // The Oniguruma->PCRE2 rewrite (exposed for tests).
  static std::string translate(std::string_view onig_pattern);

 private:
  bool search(std::string_view text, size_t from, size_t& s, size_t& e) const;
  static size_t next_char(std::string_view text, size_t pos);
  void* code_ = nullptr;
  bool jit_ = false;
  std::string pattern_;
};

}  // namespace fathom::tok
