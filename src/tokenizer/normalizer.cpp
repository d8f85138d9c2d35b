#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fathom::tok {

std::string unicode_normalize(const std::string& s, UnicodeNormalizer::Form form) {
  int opts = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeNormalizer::Form::NFC: opts |= UTF8PROC_COMPOSE; break;
    case UnicodeNormalizer::Form::NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case UnicodeNormalizer::Form::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case UnicodeNormalizer::Form::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                        &out, static_cast<utf8proc_option_t>(opts));
  if (n < 0) fail("unicode normalization failed: ", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

void UnicodeNormalizer::normalize(std::string& s) const {
  // Fast path: text made only of code points below U+0300 (no byte >= 0xCC) is already NFC;
  // pure ASCII is invariant under every form.
  unsigned char limit = form_ == Form::NFC ? 0xCC : 0x80;
  bool trivial = true;
  for (unsigned char c : s) {
    if (c >= limit) {
      trivial = false;
      break;
    }
  }
  if (trivial) return;
  s = unicode_normalize(s, form_);
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.value("type", "");
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeNormalizer::Form::NFKD);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(j.at("prepend").get<std::string>());
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> items;
    for (const auto& n : j.at("normalizers")) {
      auto p = make_normalizer(n);
      if (p) items.push_back(std::move(p));
    }
    if (items.empty()) return nullptr;
    if (items.size() == 1) return std::move(items[0]);
    return std::make_unique<SequenceNormalizer>(std::move(items));
  }
  fail("unsupported normalizer type '", type, "' in tokenizer.json");
}

}  // namespace fathom::tok
