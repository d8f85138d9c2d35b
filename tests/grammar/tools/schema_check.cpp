// Batch driver for the JSON Schema corpus and test-suite checks (tests/grammar/schema_corpus.py,
// tests/grammar/test_schema_suite.py). Reads one request per stdin line, answers one line each:
//   compile <schema file>              -> "ok <compile ms> <ignored count>" | "refused <keyword> <message>"
//   sample <schema file> <n> <seed>    -> n lines "<0|1 complete> <hex of the output>" | "refused ..."
//                                         (seeded uniform random "model" over the allowed tokens)
//   recognize <schema file> <hex text> -> "1" (the grammar accepts the text) | "0" | "refused ..."
//   schema_check [--tokenizer FILE] [--best-effort] [--undeclared-keys free-form|any|none]
//   (--tokenizer: for sample)
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

using namespace fathom::grammar;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// "refused <keyword> <message>": the keyword quoted in the message, or "-" for other errors.
std::string refusal(const std::string& msg) {
  std::string kw = "-";
  if (size_t at = msg.find("unsupported keyword '"); at != std::string::npos) {
    size_t start = at + 21, end = msg.find('\'', start);
    kw = msg.substr(start, end - start);
  }
  std::string flat = msg;
  for (char& c : flat)
    if (c == '\n') c = ' ';
  return "refused " + kw + " " + flat;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer;
  SchemaOptions opts;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--tokenizer" && i + 1 < argc) tokenizer = argv[++i];
    else if (k == "--best-effort") opts.best_effort = true;
    else if (k == "--undeclared-keys" && i + 1 < argc) {
      std::string v = argv[++i];
      opts.undeclared_keys = v == "any" ? UndeclaredKeys::Any : v == "none" ? UndeclaredKeys::None : UndeclaredKeys::FreeForm;
    }
    else {
      std::cerr << "unknown flag " << k << "\n";
      return 2;
    }
  }
  std::shared_ptr<const Vocabulary> bytes = testing::byte_vocab(), vocab;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, path;
    in >> cmd >> path;
    try {
      auto t0 = std::chrono::steady_clock::now();
      SchemaReport report;
      auto g = grammar_from_json_schema(read_file(path), opts, &report);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (cmd == "compile") {
        std::cout << "ok " << ms << " " << report.ignored.size() << "\n";
      } else if (cmd == "recognize") {
        std::string hex;
        in >> hex;
        Matcher m(CompiledGrammar::compile(g, bytes));
        std::cout << (m.accept_bytes(from_hex(hex)) && m.is_accepting() ? 1 : 0) << "\n";
      } else if (cmd == "sample") {
        size_t n = 0;
        uint64_t seed = 1;
        in >> n >> seed;
        if (!vocab) vocab = testing::tokenizer_vocab(tokenizer);
        testing::RandomModel model(CompiledGrammar::compile(g, vocab), seed);
        for (size_t i = 0; i < n; ++i) {
          auto gen = model.generate((i * 7) % 48, 3000);
          std::cout << (gen.complete ? 1 : 0) << ' ';
          for (unsigned char c : gen.text) {
            static const char* kHex = "0123456789abcdef";
            std::cout << kHex[c >> 4] << kHex[c & 15];
          }
          std::cout << "\n";
        }
      } else {
        std::cout << "error unknown command\n";
      }
    } catch (const fathom::Error& e) {
      size_t n = 1;
      if (cmd == "sample") in >> n;
      std::cout << refusal(e.what()) << "\n";
    }
    std::cout.flush();
  }
  return 0;
}
