#include "grammar/compiler.h"

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace fathom::grammar {

namespace {
std::string cache_key(const GrammarSpec& spec) {
  std::string key(1, static_cast<char>('0' + static_cast<int>(spec.kind) + (spec.best_effort ? 16 : 0)));
  key += static_cast<char>('0' + static_cast<int>(spec.undeclared_keys));
  key += spec.text;
  for (const auto& c : spec.choices) key += '\0' + std::to_string(c.size()) + ':' + c;
  return key;
}
}  // namespace

std::shared_ptr<const Grammar> build_grammar(const GrammarSpec& spec, std::vector<std::string>* warnings) {
  switch (spec.kind) {
    case GrammarKind::JsonSchema: {
      SchemaReport report;
      auto g = grammar_from_json_schema(spec.text, SchemaOptions{spec.best_effort, spec.undeclared_keys},
                                        &report);
      if (warnings) *warnings = std::move(report.warnings);
      return g;
    }
    case GrammarKind::JsonObject: return json_object_grammar();
    case GrammarKind::Regex: return grammar_from_regex(spec.text);
    case GrammarKind::Choice: return grammar_from_choices(spec.choices);
    case GrammarKind::Gbnf: return grammar_from_gbnf(spec.text);
  }
  return nullptr;
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(capacity) {}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec, std::vector<std::string>* warnings) {
  std::string key = cache_key(spec);
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      if (warnings) *warnings = it->second->second.warnings;
      return it->second->second.grammar;
    }
  }
  // Compiled outside the lock: two threads may compile the same spec once each, harmlessly.
  std::vector<std::string> found;
  auto cg = CompiledGrammar::compile(build_grammar(spec, &found), vocab_);
  if (warnings) *warnings = found;
  std::lock_guard lock(mu_);
  if (index_.count(key)) return cg;
  lru_.emplace_front(key, Compiled{cg, std::move(found)});
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return cg;
}

}  // namespace fathom::grammar
