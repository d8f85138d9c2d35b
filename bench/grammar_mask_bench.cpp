// Token-mask benchmark of the grammar engine on one core: for a few realistic JSON schemas at a
// large vocabulary, the grammar compile time, the vocabulary (trie) build time, the per-vocabulary
// compile (context-independent token cache) and the mask time per token over seeded constrained
// random generations, with the matcher's mask cache on (as served: a schema's first generations,
// "cold", and after other generations of it, "warm") and off (every mask computed).
//   grammar_mask_bench [--tokenizer FILE] [--padded N] [--gens N] [--close-after N] [--union FILE] [--schema FILE]
// --schema times that JSON schema instead of the built-in ones.
// --union adds the distinct tokens of other tokenizers (comma-separated) (up to --padded ids): a stand-in for a
// 248K vocabulary (Qwen3.5) when only smaller tokenizers are at hand.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

using namespace fathom::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Schema {
  const char* name;
  const char* text;  // empty: json_object
};

const Schema kSchemas[] = {
    {"tool_call", R"s({"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object",
      "properties":{"location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},
      "required":["location","unit"],"additionalProperties":false}},"required":["name","arguments"]})s"},
    {"person", R"s({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "email":{"type":"string","pattern":"[a-z0-9._]+@[a-z]+\\.(com|org)"},"phones":{"type":"array","items":{"type":"string"},"maxItems":3},
      "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"[0-9]{5}"}},
      "required":["street","city"]},"active":{"type":"boolean"}},"required":["name","age","address"]})s"},
    {"order", R"s({"type":"object","properties":{"order_id":{"type":"string"},"customer":{"$ref":"#/$defs/customer"},
      "lines":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"},
      "price":{"type":"number"},"note":{"type":["string","null"]}},"required":["sku","qty","price"]},"minItems":1,"maxItems":8},
      "status":{"enum":["new","paid","shipped","cancelled"]},"total":{"type":"number"}},"required":["order_id","customer","lines","status"],
      "$defs":{"customer":{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"tier":{"enum":["gold","silver"]}},
      "required":["id","name"]}}})s"},
    {"json_object", ""},
};

struct Percentiles {
  double median, p90, p99, max;
};
Percentiles percentiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  return {at(0.5), at(0.9), at(0.99), v.back()};
}

// The first vocabulary plus the second's tokens that it lacks, up to `limit` ids (0: all).
std::shared_ptr<const Vocabulary> union_vocab(const Vocabulary& a, const Vocabulary* b, size_t limit) {
  std::vector<std::string> bytes;
  std::vector<uint8_t> special;
  std::unordered_set<std::string> seen;
  for (uint32_t id = 0; id < a.size(); ++id) {
    bytes.push_back(a.is_special(id) ? std::string() : a.bytes(id));
    special.push_back(a.is_special(id));
    seen.insert(bytes.back());
  }
  for (uint32_t id : b ? b->sorted() : std::vector<uint32_t>{}) {
    if (limit && bytes.size() >= limit) break;
    if (!seen.insert(b->bytes(id)).second) continue;
    bytes.push_back(b->bytes(id));
    special.push_back(0);
  }
  if (!b && bytes.size() < limit) bytes.resize(limit), special.resize(limit, 1);  // padding ids
  return std::make_shared<Vocabulary>(std::move(bytes), std::move(special), a.stop_ids());
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer;
  for (const char* p : {"../shared/fixtures/tokenizers/qwen35/tokenizer.json", "../shared/fixtures/tokenizers/qwen3.5/tokenizer.json"})
    if (std::filesystem::exists(p)) tokenizer = p;
  if (tokenizer.empty()) tokenizer = std::string(FATHOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3/tokenizer.json";
  std::string union_with, schema_file;
  size_t padded = 0, gens = 20, close_after = 48;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokenizer") tokenizer = v;
    else if (k == "--padded") padded = std::stoul(v);
    else if (k == "--gens") gens = std::stoul(v);
    else if (k == "--close-after") close_after = std::stoul(v);
    else if (k == "--union") union_with = v;
    else if (k == "--schema") schema_file = v;
  }
  std::vector<Schema> schemas(std::begin(kSchemas), std::end(kSchemas));
  std::string schema_text;
  if (!schema_file.empty()) {
    std::ifstream in(schema_file);
    schema_text.assign(std::istreambuf_iterator<char>(in), {});
    schemas = {Schema{"file", schema_text.c_str()}};
  }
  try {
    auto t0 = Clock::now();
    auto vocab = testing::tokenizer_vocab(tokenizer, union_with.empty() ? padded : 0);
    for (size_t at = 0; at < union_with.size();) {  // comma-separated
      size_t comma = std::min(union_with.find(',', at), union_with.size());
      std::string file = union_with.substr(at, comma - at);
      vocab = union_vocab(*vocab, testing::tokenizer_vocab(file).get(), padded);
      tokenizer += " + distinct tokens of " + file;
      at = comma + 1;
      if (at >= union_with.size()) vocab = union_vocab(*vocab, nullptr, padded);
    }
    std::printf("tokenizer %s\nvocabulary %zu ids, %zu grammar tokens, trie %zu nodes: load + trie %.0f ms\n\n",
                tokenizer.c_str(), vocab->size(), vocab->sorted().size(), vocab->trie().size(), ms_since(t0));
    std::printf("%-12s %9s %9s %9s %9s | %-6s %7s %8s %8s %8s %8s\n", "schema", "grammar", "compile", "groups",
                "uncertain", "cache", "masks", "median", "p90", "p99", "max");
    for (const Schema& s : schemas) {
      t0 = Clock::now();
      auto g = *s.text ? grammar_from_json_schema(s.text) : json_object_grammar();
      double grammar_ms = ms_since(t0);
      t0 = Clock::now();
      auto cg = CompiledGrammar::compile(g, vocab);
      double compile_ms = ms_since(t0);
      // "cold": the cache on, the grammar's first generations (position groups classified on
      // first use, the shared mask cache empty): a new schema's first request. "warm": the cache
      // on after `gens` generations of other seeds: a schema that has been served before.
      // "off": every mask computed (groups already classified by the runs before).
      struct Mode {
        const char* name;
        size_t cache;
        uint64_t seed;
        bool measured;
      };
      const Mode modes[] = {{"cold", 16, 1234, true}, {"", 16, 99, false}, {"warm", 16, 1234, true}, {"off", 0, 1234, true}};
      for (const Mode& mode : modes) {
        testing::RandomModel model(cg, mode.seed);
        std::vector<double> times;
        size_t incomplete = 0;
        for (size_t i = 0; i < gens; ++i) {
          auto gen = model.generate(close_after, 4000, mode.cache);
          incomplete += !gen.complete;
          times.insert(times.end(), gen.mask_us.begin(), gen.mask_us.end());
        }
        if (!mode.measured) continue;
        auto p = percentiles(times);
        std::printf("%-12s %7.2fms %7.0fms %9zu %9zu | %-6s %7zu %6.1fus %6.1fus %6.1fus %6.0fus%s\n", s.name,
                    grammar_ms, compile_ms, cg->stats().groups, cg->stats().uncertain, mode.name, times.size(),
                    p.median, p.p90, p.p99, p.max, incomplete ? "  (some outputs did not end)" : "");
      }
    }
  } catch (const fathom::Error& e) {
    std::fprintf(stderr, "grammar_mask_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
