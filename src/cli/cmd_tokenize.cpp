// `fathom tokenize PATH (--text T | --text-file F | --input-json FILE) [--json] [--no-special] [--bench N]` and
// `fathom detokenize PATH --ids 1,2,3 [--skip-special-tokens]`; PATH is a model or tokenizer folder.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace fathom::cli {
namespace {

struct TokenizeOpts {
  std::string path, text, input_json, text_file;
  bool json = false, no_special = false;
  int bench = 0;  // > 0: time this many encodes of the text and print a JSON report
};
struct DetokenizeOpts {
  std::string path, ids;
  bool skip_special = false;
};

void run_tokenize(const TokenizeOpts& o) {
  auto tok = tok::Tokenizer::from_dir(o.path);
  if (!o.input_json.empty()) {
    std::ifstream f(o.input_json, std::ios::binary);
    FATHOM_CHECK(f, "cannot open --input-json file ", o.input_json);
    nlohmann::json in;
    try {
      in = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      fail(o.input_json, ": invalid JSON: ", e.what());
    }
    FATHOM_CHECK(in.is_array(), o.input_json, ": expected a JSON list of strings");
    for (const auto& s : in) FATHOM_CHECK(s.is_string(), o.input_json, ": expected a JSON list of strings");
    if (o.bench > 0) {  // time encoding every string, one after the other
      nlohmann::json times = nlohmann::json::array();
      size_t n_tokens = 0, n_bytes = 0;
      for (int r = 0; r < o.bench; ++r) {
        n_tokens = n_bytes = 0;
        auto t0 = std::chrono::steady_clock::now();
        for (const auto& s : in) {
          const auto& str = s.get_ref<const std::string&>();
          n_tokens += tok.encode(str, !o.no_special).size();
          n_bytes += str.size();
        }
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::cout << nlohmann::json{{"bytes", n_bytes}, {"tokens", n_tokens}, {"seconds", times}}.dump() << "\n";
      return;
    }
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : in) out.push_back(tok.encode(s.get_ref<const std::string&>(), !o.no_special));
    std::cout << out.dump() << "\n";
    return;
  }
  std::string text = o.text;
  if (!o.text_file.empty()) {
    std::ifstream f(o.text_file, std::ios::binary);
    FATHOM_CHECK(f, "cannot open --text-file ", o.text_file);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  if (o.bench > 0) {
    nlohmann::json times = nlohmann::json::array();
    size_t n_tokens = 0;
    for (int r = 0; r < o.bench; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      n_tokens = tok.encode(text, !o.no_special).size();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::cout << nlohmann::json{{"bytes", text.size()}, {"tokens", n_tokens}, {"seconds", times}}.dump() << "\n";
    return;
  }
  auto ids = tok.encode(text, !o.no_special);
  if (o.json) {
    std::cout << nlohmann::json(ids).dump() << "\n";
    return;
  }
  std::string line;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) line += ',';
    line += std::to_string(ids[k]);
  }
  std::cout << line << "\n";
}

std::vector<uint32_t> parse_ids(const std::string& s) {
  std::vector<uint32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t[]"), b = item.find_last_not_of(" \t[]");
    if (a == std::string::npos) continue;
    item = item.substr(a, b - a + 1);
    try {
      size_t used = 0;
      unsigned long v = std::stoul(item, &used);
      FATHOM_CHECK(used == item.size() && v <= 0xFFFFFFFFul, "invalid token id '", item, "' in --ids");
      ids.push_back(static_cast<uint32_t>(v));
    } catch (const std::logic_error&) {
      fail("invalid token id '", item, "' in --ids");
    }
  }
  return ids;
}

const CommandRegistrar reg_tokenize([](CLI::App& app) {
  auto o = std::make_shared<TokenizeOpts>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids with a model's tokenizer.json");
  cmd->add_option("path", o->path, "Model or tokenizer folder (or a tokenizer.json)")->required();
  auto* text = cmd->add_option("--text", o->text, "Text to encode");
  auto* ij = cmd->add_option("--input-json", o->input_json, "JSON file with a list of strings; prints a list of id lists");
  auto* tf = cmd->add_option("--text-file", o->text_file, "Encode the contents of a file");
  text->excludes(ij);
  tf->excludes(text);
  tf->excludes(ij);
  cmd->add_option("--bench", o->bench, "Time N encodes of the text or of all --input-json strings (single thread); print a JSON report");
  cmd->add_flag("--json", o->json, "Print the ids as a JSON list");
  cmd->add_flag("--no-special", o->no_special, "Do not add special tokens (BOS etc.)");
  cmd->callback([o, text, ij, tf] {
    FATHOM_CHECK(text->count() + ij->count() + tf->count() == 1, "tokenize: give --text, --text-file or --input-json");
    run_tokenize(*o);
  });

  auto d = std::make_shared<DetokenizeOpts>();
  auto* dc = app.add_subcommand("detokenize", "Decode token ids to text with a model's tokenizer.json");
  dc->add_option("path", d->path, "Model or tokenizer folder (or a tokenizer.json)")->required();
  dc->add_option("--ids", d->ids, "Comma-separated token ids")->required();
  dc->add_flag("--skip-special-tokens", d->skip_special, "Leave special tokens out of the text");
  dc->callback([d] {
    auto tok = tok::Tokenizer::from_dir(d->path);
    std::cout << tok.decode(parse_ids(d->ids), d->skip_special) << "\n";
  });
});

}  // namespace
}  // namespace fathom::cli
