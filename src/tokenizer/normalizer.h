// Normalizers from tokenizer.json: NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Sequence; null = none.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace fathom::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Normalizes s in place. s is valid UTF-8.
  virtual void normalize(std::string& s) const = 0;
};

class UnicodeNormalizer : public Normalizer {
 public:
  enum class Form { NFC, NFD, NFKC, NFKD };
  explicit UnicodeNormalizer(Form f) : form_(f) {}
  void normalize(std::string& s) const override;

 private:
  Form form_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> n) : items_(std::move(n)) {}
  void normalize(std::string& s) const override {
    for (auto& n : items_) n->normalize(s);
  }
  bool empty() const { return items_.empty(); }

 private:
  std::vector<std::unique_ptr<Normalizer>> items_;
};

// Builds a normalizer from its JSON; null JSON (or an empty Sequence) gives nullptr.
// Unsupported types throw fathom::Error.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

// Unicode normalization of a whole string (used by tests and by the normalizer).
std::string unicode_normalize(const std::string& s, UnicodeNormalizer::Form form);

}  // namespace fathom::tok
