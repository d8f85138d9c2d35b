// OpenAI's Responses API (POST /v1/responses) over the chat completions machinery, as
// anthropic_messages.h does for Anthropic's: a request becomes the equivalent
// /v1/chat/completions body (input items as messages, instructions as the system message,
// function tools, tool_choice, text.format as response_format, max_output_tokens as max_tokens),
// which parse_request() validates and renders as any chat request; the chat response becomes a
// Response object. previous_response_id continues a conversation kept by a ResponseStore.
// Fields outside the Responses API that we serve are refused with a 400 naming them.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/protocol.h"

namespace fathom::server {

// The conversations of stored responses (input and output as chat messages), the most recent
// `capacity` of them (capacity 0: none kept, previous_response_id is refused). Thread-safe.
class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }
  void put(const std::string& id, nlohmann::ordered_json messages);
  // The stored conversation, or null when the id is unknown (or was evicted).
  nlohmann::ordered_json get(const std::string& id);

 private:
  size_t capacity_;
  std::mutex mu_;
  std::list<std::string> order_;  // most recent first
  std::unordered_map<std::string, std::pair<nlohmann::ordered_json, std::list<std::string>::iterator>> map_;
};

struct ResponsesRequest {
  nlohmann::ordered_json chat_body;  // the /v1/chat/completions body it stands for
  nlohmann::ordered_json echo;          // the request fields a Response object repeats
  // The conversation so far as chat messages, without the instructions (they do not carry over
  // to a later turn): what the store keeps with the response.
  nlohmann::ordered_json conversation;
  bool stream = false, store = true;
};

// The request body of /v1/responses. Throws ApiError 400 naming a refused or malformed field, or
// an unknown (or unstored) previous_response_id.
ResponsesRequest translate_responses_request(std::string_view body, ResponseStore& store);

// The output items of a non-streamed chat completion (reasoning, message, function calls), ids
// made by `new_id` with the item's prefix ("rs_", "msg_", "fc_").
nlohmann::ordered_json responses_output(const nlohmann::ordered_json& chat_response,
                                        const std::function<std::string(const char*)>& new_id);

// The Response object: id, status (completed, or incomplete with max_output_tokens), the output
// items, usage, and the request's fields it repeats.
nlohmann::ordered_json responses_object(const std::string& id, int64_t created_at, const std::string& model,
                                        const nlohmann::ordered_json& echo, const std::string& status,
                                        nlohmann::ordered_json output, const nlohmann::ordered_json& usage);

// The conversation after a response: the request's and the response's output items as the
// assistant's turn (what a later previous_response_id starts from).
nlohmann::ordered_json responses_conversation(nlohmann::ordered_json conversation, const nlohmann::ordered_json& output);

// Chat usage ({prompt_tokens, completion_tokens}) in the Responses shape.
nlohmann::ordered_json responses_usage(const nlohmann::ordered_json& chat_usage);

}  // namespace fathom::server
