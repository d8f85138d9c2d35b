// Constrained random generation for the Python schema test: a seeded uniform "model" over the
// allowed tokens of a real vocabulary, closing the output after a few tokens. Writes one line per
// output: "<0|1 complete> <hex of the output bytes>".
//   grammar_sample --tokenizer FILE --schema FILE --count N --seed S --out FILE [--padded N]
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

using namespace fathom::grammar;

int main(int argc, char** argv) {
  std::string tokenizer, schema_path, out_path;
  size_t count = 200, padded = 0;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokenizer") tokenizer = v;
    else if (k == "--schema") schema_path = v;
    else if (k == "--out") out_path = v;
    else if (k == "--count") count = std::stoul(v);
    else if (k == "--seed") seed = std::stoull(v);
    else if (k == "--padded") padded = std::stoul(v);
    else {
      std::cerr << "unknown flag " << k << "\n";
      return 2;
    }
  }
  try {
    std::ifstream in(schema_path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto vocab = testing::tokenizer_vocab(tokenizer, padded);
    auto cg = CompiledGrammar::compile(grammar_from_json_schema(ss.str()), vocab);
    testing::RandomModel model(cg, seed);
    std::ofstream out(out_path);
    for (size_t i = 0; i < count; ++i) {
      auto gen = model.generate((i * 7) % 64, 4000);
      out << (gen.complete ? 1 : 0) << ' ';
      for (unsigned char c : gen.text) {
        char buf[3];
        std::snprintf(buf, sizeof buf, "%02x", c);
        out << buf;
      }
      out << '\n';
    }
  } catch (const fathom::Error& e) {
    std::cerr << "grammar_sample: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
