// Renders every case of tests/fixtures/chat/cases.json (produced by
// tools/make_chat_template_cases.py with Python jinja2) with each real template and compares
// byte for byte; cases that raised in Python must raise here too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"

namespace {

using fathom::chat::ChatTemplate;
using json = nlohmann::ordered_json;

json load_cases() {
  std::ifstream in(std::string(FATHOM_FIXTURES_DIR) + "/chat/cases.json", std::ios::binary);
  EXPECT_TRUE(in) << "missing tests/fixtures/chat/cases.json";
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out.push_back(c);
  }
  return out;
}

std::string diff_snippet(const std::string& want, const std::string& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  size_t from = k > 60 ? k - 60 : 0;
  std::ostringstream os;
  os << "first difference at byte " << k << " (expected " << want.size() << " bytes, got " << got.size() << ")\n"
     << "  expected: ..." << escape(want.substr(from, 140)) << "\n"
     << "  got:      ..." << escape(got.substr(from, 140));
  return os.str();
}

TEST(ChatTemplateCases, MatchPythonJinja2) {
  json doc = load_cases();
  ASSERT_TRUE(doc.contains("cases"));
  std::map<std::string, std::pair<std::unique_ptr<ChatTemplate>, json>> templates;
  for (auto it = doc["templates"].begin(); it != doc["templates"].end(); ++it) {
    auto loaded = fathom::chat::load_chat_template(std::string(FATHOM_SHARED_DIR) + "/" + it.value().get<std::string>());
    templates[it.key()] = {std::make_unique<ChatTemplate>(loaded.source), loaded.special_tokens};
  }
  size_t passed = 0, renders = 0, errors = 0;
  for (const auto& exp : doc["expected"]) {
    const json& c = doc["cases"][exp["case"].get<size_t>()];
    const std::string name = exp["template"];
    SCOPED_TRACE(c["id"].get<std::string>() + " / " + name);
    auto& [tmpl, specials] = templates.at(name);
    std::string got, err;
    bool threw = false;
    try {
      got = tmpl->render(c["messages"], c["tools"], c["add_generation_prompt"].get<bool>(), c["kwargs"], specials);
    } catch (const fathom::Error& e) {
      threw = true;
      err = e.what();
    }
    if (exp.contains("error")) {
      ++errors;
      const std::string type = exp["error"]["type"], msg = exp["error"]["message"];
      if (!threw) {
        ADD_FAILURE() << "Python raised " << type << ": " << msg << " but Fathom rendered:\n" << escape(got.substr(0, 300));
        continue;
      }
      if (type == "TemplateError" && err.find(msg) == std::string::npos) {
        ADD_FAILURE() << "raise_exception message mismatch: expected '" << msg << "', got '" << err << "'";
        continue;
      }
      ++passed;
      continue;
    }
    ++renders;
    if (threw) {
      ADD_FAILURE() << "Fathom raised: " << err;
      continue;
    }
    const std::string want = exp["output"];
    if (got != want) {
      ADD_FAILURE() << diff_snippet(want, got);
      continue;
    }
    ++passed;
  }
  std::printf("chat template cases: %zu passed of %zu (%zu renders, %zu expected errors)\n", passed,
              renders + errors, renders, errors);
  EXPECT_GE(doc["cases"].size(), 60u);
}

TEST(ChatTemplateCases, LoaderReadsTokenizerConfigAndJinjaFiles) {
  std::string shared = FATHOM_SHARED_DIR;
  auto q3 = fathom::chat::load_chat_template(shared + "/fixtures/tokenizers/qwen3/tokenizer_config.json");
  EXPECT_NE(q3.source.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(q3.special_tokens.value("eos_token", ""), "<|im_end|>");
  EXPECT_FALSE(q3.special_tokens.contains("bos_token"));
  auto ds = fathom::chat::load_chat_template(shared + "/fixtures/tokenizers/deepseek_v3");
  EXPECT_EQ(ds.special_tokens.value("bos_token", ""), "<｜begin▁of▁sentence｜>");
  auto q35 = fathom::chat::load_chat_template(shared + "/fixtures/chat_templates/qwen3.5");
  EXPECT_NE(q35.source.find("render_content"), std::string::npos);

  auto dir = std::filesystem::temp_directory_path() / "fathom_chat_loader_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"bos_token": "<s>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}]})";
  }
  auto loaded = fathom::chat::load_chat_template(dir);
  EXPECT_EQ(loaded.source, "D{{ bos_token }}");
  EXPECT_EQ(ChatTemplate(loaded.source).render(json::array(), nullptr, false, json::object(), loaded.special_tokens), "D<s>");
  std::filesystem::remove_all(dir);
}

}  // namespace
