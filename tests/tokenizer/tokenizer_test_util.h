// Shared helpers for the tokenizer tests: fixture paths, cached tokenizers, escaping for messages.
#pragma once
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace fathom::tok::testing {

inline std::string fixtures_dir() { return std::string(FATHOM_FIXTURES_DIR) + "/tokenizer"; }
// A real HF tokenizer folder (qwen3, llama3, deepseek_v3) checked in under tests/fixtures/tokenizers.
inline std::string real_tokenizer_dir(const std::string& name) {
  return std::string(FATHOM_FIXTURES_DIR) + "/tokenizers/" + name;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

// Qwen3.5's pre-tokenizer regex: Qwen3's with \p{M} counted with letters (the Qwen3.5 tokenizer
// itself is not a fixture: its files are large).
inline std::string qwen35_tokenizer_json() {
  auto j = read_json(real_tokenizer_dir("qwen3") + "/tokenizer.json");
  auto replace = [](std::string s, const std::string& a, const std::string& b) {
    auto p = s.find(a);
    if (p == std::string::npos) throw std::runtime_error("qwen3 regex changed: " + a);
    return s.replace(p, a.size(), b);
  };
  for (auto& p : j["pre_tokenizer"]["pretokenizers"]) {
    if (p["type"] != "Split") continue;
    std::string r = p["pattern"]["Regex"];
    r = replace(r, "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", "[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+");
    r = replace(r, " ?[^\\s\\p{L}\\p{N}]+", " ?[^\\s\\p{L}\\p{M}\\p{N}]+");
    p["pattern"]["Regex"] = r;
  }
  return j.dump();
}

// Tokenizers by name (qwen3, llama3, deepseek_v3, qwen35), loaded once per test binary.
inline const Tokenizer& get_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    if (name == "qwen35") {
      slot = std::make_unique<Tokenizer>(Tokenizer::from_json_string(qwen35_tokenizer_json(), "qwen35"));
    } else {
      slot = std::make_unique<Tokenizer>(Tokenizer::from_dir(real_tokenizer_dir(name)));
    }
  }
  return *slot;
}

inline const std::vector<std::string>& corpus() {
  static const std::vector<std::string> c = read_json(fixtures_dir() + "/corpus.json").get<std::vector<std::string>>();
  return c;
}

// Escapes a string for a readable failure message (non-ASCII and controls as \u{...}).
inline std::string escape(const std::string& s, size_t max_len = 200) {
  std::string out;
  size_t i = 0;
  while (i < s.size() && out.size() < max_len) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    char32_t cp = c;
    int n = 1;
    if (c >= 0xF0) { cp = c & 0x07; n = 4; } else if (c >= 0xE0) { cp = c & 0x0F; n = 3; } else if (c >= 0xC0) { cp = c & 0x1F; n = 2; }
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += n;
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u{%X}", static_cast<unsigned>(cp));
    out += buf;
  }
  if (i < s.size()) out += "...";
  return out;
}

inline std::string ids_str(const std::vector<uint32_t>& ids, size_t max_n = 40) {
  std::string s = "[";
  for (size_t k = 0; k < ids.size() && k < max_n; ++k) {
    if (k) s += ',';
    s += std::to_string(ids[k]);
  }
  if (ids.size() > max_n) s += ",...";
  return s + "] (" + std::to_string(ids.size()) + " ids)";
}

}  // namespace fathom::tok::testing
