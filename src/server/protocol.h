// OpenAI-compatible field parsing and validation, and error objects. Everything a client can
// get wrong becomes an ApiError (status + OpenAI error JSON).
// Which fields a request may hold at all is decided in request_parser.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/request.h"
#include "server/reasoning_parser.h"  // ReasoningParser, which lived here

namespace fathom::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // empty -> null
  std::string code;   // empty -> null
};

// {"error": {"message", "type", "param", "code"}} with the OpenAI type for the status.
nlohmann::ordered_json error_json(const ApiError& e);
std::string error_type(int status);

// Typed accessors: a missing or null field gives nullopt; a wrong type or a value outside
// [lo, hi] throws ApiError 400 naming the field.
std::optional<double> get_number(const nlohmann::ordered_json& j, const char* key, double lo, double hi);
std::optional<int64_t> get_int(const nlohmann::ordered_json& j, const char* key, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const nlohmann::ordered_json& j, const char* key);
std::optional<std::string> get_string(const nlohmann::ordered_json& j, const char* key);

// Fields shared by /v1/completions and /v1/chat/completions.
struct CommonParams {
  RequestParams params;      // max_tokens not final yet
  std::optional<int64_t> max_tokens;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool seed_given = false;
  bool return_token_ids = false;
};
// `chat` selects the chat spelling of logprobs (bool + top_logprobs) and max_completion_tokens.
CommonParams parse_common(const nlohmann::ordered_json& body, bool chat, int64_t vocab_size, bool have_tokenizer);

}  // namespace fathom::server
