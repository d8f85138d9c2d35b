// From the bytes of a /v1/completions or /v1/chat/completions body to a validated request:
// JSON parsed with a nesting limit (before anything walks it recursively), every field either
// taken into account, explicitly ignored (a short documented list), or refused with a 400 that
// names it; chat messages reduced to the keys a template reads, then rendered and tokenized.
// Pure: no engine, no sockets, so the fuzzer drives it directly (tests/fuzz/fuzz_request.cpp).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/json_schema.h"
#include "server/protocol.h"

namespace fathom::tok {
class Tokenizer;
}
namespace fathom::chat {
class ChatTemplate;
}
namespace fathom::grammar {
class GrammarCompiler;
}

namespace fathom::server {

constexpr int kMaxJsonDepth = 64;

// Parses `text` as JSON, refusing nesting deeper than kMaxJsonDepth while parsing (ApiError 400
// naming the limit) and anything that is not JSON (ApiError 400).
nlohmann::ordered_json parse_json_limited(std::string_view text, const char* what = "the request body");

// What the parser needs from the server: the model's tokenizer, chat template and limits.
struct RequestContext {
  const tok::Tokenizer* tokenizer = nullptr;    // null: --skip-tokenizer-init
  const chat::ChatTemplate* chat_template = nullptr;
  std::string template_error;                  // why there is no chat template
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  std::vector<std::string> model_names;         // names a request may give in "model"
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  bool allow_fault_injection = false;           // the test-only "fathom_fault" field
  bool auto_tool_choice = false;                // --enable-auto-tool-choice (with a --tool-call-parser)
  grammar::GrammarCompiler* grammars = nullptr; // structured output (null: no tokenizer)
  bool schema_best_effort = false;              // --structured-output-best-effort
  grammar::UndeclaredKeys schema_undeclared_keys = grammar::UndeclaredKeys::FreeForm;  // --structured-output-undeclared-keys
};

struct ParsedRequest {
  bool chat = false;
  CommonParams common;                      // params.max_tokens final
  std::vector<std::vector<int32_t>> prompts;
  std::string rendered_prompt;              // chat: the template's output
  nlohmann::ordered_json tools = nullptr;   // chat: the tools the model was told about (null: none)
  // chat: "required" and a named function are enforced by a grammar over a JSON form (as vLLM):
  // a list of {"name", "parameters"} objects, or the named function's arguments object.
  enum class ToolChoice { Auto, None, Required, Named } tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;             // ToolChoice::Named
  // chat: SGLang's separate_reasoning and stream_reasoning, vLLM's include_reasoning (all true by
  // default; they act only with --reasoning-parser). Not separated: the reasoning stays in content;
  // not streamed: it goes out in one delta once it ends; not included: it is dropped.
  struct Reasoning {
    bool separate = true, stream = true, include = true;
  } reasoning;
  bool echo = false;                        // completions: the prompt's text leads each choice
  std::vector<std::string> echo_texts;      // per prompt, when echo
  std::vector<std::string> grammar_warnings;  // JSON Schema keywords best effort left unenforced
};

ParsedRequest parse_request(std::string_view body, bool chat, const RequestContext& ctx);

// vLLM's POST /tokenize: a "prompt" (completions' form: text, add_special_tokens default true) or
// "messages" (chat's: rendered as /v1/chat/completions would, with add_generation_prompt,
// continue_final_message, chat_template_kwargs, tools; add_special_tokens default false). vLLM's
// router asks it for the token ids its cache-aware policy matches prefixes on.
struct TokenizeRequest {
  std::vector<int32_t> tokens;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body, const RequestContext& ctx);

// vLLM's POST /detokenize: {"tokens": [ids], "model"?} -> the text (special tokens kept, as vLLM).
// Ids outside the vocabulary are a 400 naming "tokens".
std::vector<int32_t> parse_detokenize_request(std::string_view body, const RequestContext& ctx);

// The fields each endpoint accepts, and those accepted but without effect (documented in
// docs/api.md). Anything else gets a 400 naming it.
const std::vector<std::string>& accepted_fields(bool chat);
const std::vector<std::string>& ignored_fields();

}  // namespace fathom::server
