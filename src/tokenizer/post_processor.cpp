#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace fathom::tok {

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return nullptr;
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> items;
    for (const auto& p : j.at("processors")) {
      auto q = make_post_processor(p);
      if (q) items.push_back(std::move(q));
    }
    if (items.empty()) return nullptr;
    return std::make_unique<SequenceProcessor>(std::move(items));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    uint32_t cls = j.at("cls").at(1).get<uint32_t>(), sep = j.at("sep").at(1).get<uint32_t>();
    return std::make_unique<WrapProcessor>(std::vector<uint32_t>{cls}, std::vector<uint32_t>{sep});
  }
  if (type == "TemplateProcessing") {
    const auto& specials = j.at("special_tokens");
    std::vector<uint32_t> before, after;
    bool seen_seq = false;
    for (const auto& piece : j.at("single")) {
      if (piece.contains("Sequence")) {
        std::string sid = piece["Sequence"].value("id", "A");
        if (sid != "A") fail("TemplateProcessing single template uses sequence '", sid, "' in tokenizer.json");
        seen_seq = true;
      } else if (piece.contains("SpecialToken")) {
        std::string name = piece["SpecialToken"].at("id").get<std::string>();
        if (!specials.contains(name)) fail("TemplateProcessing special token '", name, "' is not defined in tokenizer.json");
        auto& dst = seen_seq ? after : before;
        for (const auto& id : specials[name].at("ids")) dst.push_back(id.get<uint32_t>());
      } else {
        fail("unsupported TemplateProcessing piece ", piece.dump(), " in tokenizer.json");
      }
    }
    return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
  }
  fail("unsupported post_processor type '", type, "' in tokenizer.json");
}

}  // namespace fathom::tok
