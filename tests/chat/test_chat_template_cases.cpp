// Renders every case of tests/fixtures/chat/cases.json (produced by
// tools/make_chat_template_cases.py with Python jinja2) with each real template and compares
// byte for byte; cases that raised in Python must raise here too. The Qwen3/Llama 3/DeepSeek V3
// templates are checked in (tests/fixtures/tokenizers); the Qwen3.5 and Qwen3-Coder templates
// come from a snapshot in ../shared that the repository must not copy, so their tests exist only
// where CMake found ../shared (FATHOM_SHARED_DIR defined).
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

// cases.json names each template by its folder under ../shared: "fixtures/tokenizers/X" is
// checked in as tests/fixtures/tokenizers/X, "fixtures/chat_templates/X" is a snapshot template.
const std::string kSnapshotPrefix = "fixtures/chat_templates/";
bool is_snapshot(const std::string& rel) { return rel.rfind(kSnapshotPrefix, 0) == 0; }
std::string template_path(const std::string& rel) {
#ifdef FATHOM_SHARED_DIR
  if (is_snapshot(rel)) return std::string(FATHOM_SHARED_DIR) + "/" + rel;
#endif
  return std::string(FATHOM_FIXTURES_DIR) + "/" + rel.substr(std::string("fixtures/").size());
}

// Checks the expected records of the checked-in templates (snapshot = false) or of the snapshot
// templates (snapshot = true).
void match_python_jinja2(bool snapshot) {
  json doc = load_cases();
  ASSERT_TRUE(doc.contains("cases"));
  std::map<std::string, std::pair<std::unique_ptr<ChatTemplate>, json>> templates;
  for (auto it = doc["templates"].begin(); it != doc["templates"].end(); ++it) {
    const std::string rel = it.value();
    if (is_snapshot(rel) != snapshot) continue;
    auto loaded = fathom::chat::load_chat_template(template_path(rel));
    templates[it.key()] = {std::make_unique<ChatTemplate>(loaded.source), loaded.special_tokens};
  }
  ASSERT_FALSE(templates.empty());
  size_t passed = 0, renders = 0, errors = 0;
  for (const auto& exp : doc["expected"]) {
    const json& c = doc["cases"][exp["case"].get<size_t>()];
    const std::string name = exp["template"];
    auto found = templates.find(name);
    if (found == templates.end()) continue;  // a template of the other group
    SCOPED_TRACE(c["id"].get<std::string>() + " / " + name);
    auto& [tmpl, specials] = found->second;
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
  std::printf("chat template cases (%s templates): %zu passed of %zu (%zu renders, %zu expected errors)\n",
              snapshot ? "snapshot" : "checked-in", passed, renders + errors, renders, errors);
  EXPECT_GE(doc["cases"].size(), 60u);
}

TEST(ChatTemplateCases, MatchPythonJinja2) { match_python_jinja2(false); }

#ifdef FATHOM_SHARED_DIR
TEST(ChatTemplateCases, SnapshotTemplatesMatchPythonJinja2) { match_python_jinja2(true); }
#endif

TEST(ChatTemplateCases, LoaderReadsTokenizerConfigAndJinjaFiles) {
  std::string tokenizers = std::string(FATHOM_FIXTURES_DIR) + "/tokenizers";
  auto q3 = fathom::chat::load_chat_template(tokenizers + "/qwen3/tokenizer_config.json");
  EXPECT_NE(q3.source.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(q3.special_tokens.value("eos_token", ""), "<|im_end|>");
  EXPECT_FALSE(q3.special_tokens.contains("bos_token"));
  auto ds = fathom::chat::load_chat_template(tokenizers + "/deepseek_v3");
  EXPECT_EQ(ds.special_tokens.value("bos_token", ""), "<｜begin▁of▁sentence｜>");

  auto dir = std::filesystem::temp_directory_path() / "fathom_chat_loader_test";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"bos_token": "<s>", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ bos_token }}"}]})";
  }
  auto loaded = fathom::chat::load_chat_template(dir);
  EXPECT_EQ(loaded.source, "D{{ bos_token }}");
  EXPECT_EQ(ChatTemplate(loaded.source).render(json::array(), nullptr, false, json::object(), loaded.special_tokens), "D<s>");
  {
    std::ofstream(dir / "chat_template.jinja") << "J{{ bos_token }}";
  }
  auto from_jinja = fathom::chat::load_chat_template(dir);  // chat_template.jinja wins, specials still read
  EXPECT_EQ(from_jinja.source, "J{{ bos_token }}");
  EXPECT_EQ(from_jinja.special_tokens.value("bos_token", ""), "<s>");
  std::filesystem::remove_all(dir);
}

#ifdef FATHOM_SHARED_DIR
TEST(ChatTemplateCases, LoaderReadsSnapshotJinjaFile) {  // a folder with chat_template.jinja alone
  auto q35 = fathom::chat::load_chat_template(std::string(FATHOM_SHARED_DIR) + "/fixtures/chat_templates/qwen3.5");
  EXPECT_NE(q35.source.find("render_content"), std::string::npos);
}
#endif

}  // namespace
