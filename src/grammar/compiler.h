// The front door for integration: a request's structured-output spec compiled against one
// vocabulary, with a thread-safe LRU cache (compiling a JSON schema at a 150K vocabulary takes
// ~10-20 ms; requests repeat schemas).
//
//   auto vocab = Vocabulary::from_tokenizer(tok, {eos_id, im_end_id}, model_vocab_size);
//   GrammarCompiler compiler(vocab);
//   auto cg = compiler.compile({GrammarKind::JsonSchema, schema_text});   // throws fathom::Error
//   Matcher m(cg);                       // one per sequence
//   m.fill_next_token_bitmask(words);    // words: vocab->mask_words() uint32, bit i = token i
//   m.accept_token(id);  m.rollback(n);  m.is_accepting();  m.is_terminated();
#pragma once
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/compiled.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/vocab.h"

namespace fathom::grammar {

enum class GrammarKind {
  JsonSchema,  // text: the schema (JSON)
  JsonObject,  // any JSON object; text unused
  Regex,       // text: the pattern
  Choice,      // choices: the allowed strings
  Gbnf,        // text: the grammar, start rule `root`
};

struct GrammarSpec {
  GrammarKind kind = GrammarKind::JsonObject;
  std::string text;
  std::vector<std::string> choices;
  // JSON Schema: leave what cannot be enforced unenforced (warnings) instead of failing.
  bool best_effort = false;
  // JSON Schema: the keys objects without additionalProperties may take beyond the declared.
  UndeclaredKeys undeclared_keys = UndeclaredKeys::FreeForm;
};

// Parses a spec into a grammar (no vocabulary). Throws fathom::Error naming what is unsupported.
// `warnings` (may be null): what best effort left unenforced.
std::shared_ptr<const Grammar> build_grammar(const GrammarSpec& spec, std::vector<std::string>* warnings = nullptr);

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t capacity = 64);
  // Thread-safe; keyed by the spec's text (a schema compiles once). Errors are not cached.
  // `warnings` (may be null) receives what best effort left unenforced (cached with the grammar).
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec, std::vector<std::string>* warnings = nullptr);
  const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }

 private:
  struct Compiled {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::vector<std::string> warnings;
  };
  using Entry = std::pair<std::string, Compiled>;
  std::shared_ptr<const Vocabulary> vocab_;
  size_t capacity_;
  std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace fathom::grammar
