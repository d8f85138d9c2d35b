// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the chat
// completions machinery: a request becomes the equivalent /v1/chat/completions body, which
// parse_request() validates, renders and tokenizes as any chat request (template, tools,
// tool_choice grammars, stop strings); the chat response becomes an Anthropic message.
// Fields outside Anthropic's that we serve are refused with a 400 naming them.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "server/protocol.h"

namespace fathom::server {

struct AnthropicRequest {
  nlohmann::ordered_json chat_body;  // the /v1/chat/completions body it stands for
  bool stream = false;
};

// The request body of /v1/messages (count_tokens: /v1/messages/count_tokens, which takes no
// max_tokens, sampling or stream). Throws ApiError 400 naming a refused or malformed field.
AnthropicRequest translate_anthropic_request(std::string_view body, bool count_tokens);

// {"type": "error", "error": {"type", "message"}} with Anthropic's type for the status.
nlohmann::ordered_json anthropic_error_json(const ApiError& e);

// Anthropic's stop_reason for a chat choice's finish_reason / stop_reason; a stop string sets
// *stop_sequence (else null).
std::string anthropic_stop_reason(const std::string& finish_reason, const nlohmann::ordered_json& stop_reason,
                                  nlohmann::ordered_json* stop_sequence);

// A non-streamed chat completion response as an Anthropic message.
nlohmann::ordered_json anthropic_message(const nlohmann::ordered_json& chat_response, const std::string& id);

}  // namespace fathom::server
