// Post-processors from tokenizer.json, for a single sequence: TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel (no ids added), Sequence; null adds nothing.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace fathom::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens around one encoded sequence (called only with add_special_tokens).
  virtual void process(std::vector<uint32_t>& ids) const = 0;
};

// Wraps a single sequence: ids `before` + sequence + ids `after`.
class WrapProcessor : public PostProcessor {
 public:
  WrapProcessor(std::vector<uint32_t> before, std::vector<uint32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<uint32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<uint32_t> before_, after_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> p) : items_(std::move(p)) {}
  void process(std::vector<uint32_t>& ids) const override {
    for (auto& p : items_) p->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> items_;
};

// null and ByteLevel give nullptr (nothing to add); unsupported types throw fathom::Error.
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j);

}  // namespace fathom::tok
