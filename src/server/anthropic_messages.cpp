#include "server/anthropic_messages.h"

#include <algorithm>
#include <set>

#include "server/json_fields.h"
#include "server/request_parser.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) { bad_field(param, msg); }

// A string, or a list of text blocks joined (system prompts, tool results). cache_control is
// accepted: prefix caching is automatic here.
std::string text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or a list of text blocks");
  std::string out;
  for (const auto& b : content) {
    object_at(b, where + "[]");
    only_keys(b, {"type", "text", "cache_control"}, where + "[]");
    if (type_of(b) != "text") bad(where, where + " holds a block of type \"" + type_of(b) + "\"; only text blocks are supported");
    out += string_at(b, "text", where + "[]");
  }
  return out;
}

// A user turn: text blocks make a user message; each tool_result a tool message, in order.
void translate_user(const json& content, json& out) {
  if (content.is_string()) return out.push_back({{"role", "user"}, {"content", content}});
  if (!content.is_array()) bad("messages", "a message's content must be a string or a list of blocks");
  std::string text;
  auto flush = [&] {
    if (!text.empty()) out.push_back({{"role", "user"}, {"content", text}});
    text.clear();
  };
  for (const auto& b : content) {
    object_at(b, "messages[].content[]");
    const std::string type = type_of(b);
    if (type == "text") {
      only_keys(b, {"type", "text", "cache_control"}, "a text block");
      text += string_at(b, "text", "text block");
    } else if (type == "tool_result") {
      only_keys(b, {"type", "tool_use_id", "content", "is_error", "cache_control"}, "a tool_result block");
      flush();
      std::string result = b.contains("content") ? text_of(b["content"], "tool_result.content") : "";
      // No field of the chat template carries the error flag: the model reads it in the text.
      const auto err = b.find("is_error");
      if (err != b.end() && !err->is_boolean()) bad("is_error", "tool_result.is_error must be a boolean");
      if (err != b.end() && err->get<bool>()) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", string_at(b, "tool_use_id", "tool_result")}, {"content", result}});
    } else {
      bad("messages", "user content block of type '" + type + "' is not supported (text and tool_result are)");
    }
  }
  flush();
}

// An assistant turn: its text, thinking (reasoning_content, which templates render as such) and
// tool_use blocks (tool_calls with the input as JSON arguments).
void translate_assistant(const json& content, json& out) {
  if (content.is_string()) return out.push_back({{"role", "assistant"}, {"content", content}});
  if (!content.is_array()) bad("messages", "a message's content must be a string or a list of blocks");
  std::string text, thinking;
  json calls = json::array();
  for (const auto& b : content) {
    object_at(b, "messages[].content[]");
    const std::string type = type_of(b);
    if (type == "text") {
      only_keys(b, {"type", "text", "cache_control", "citations"}, "a text block");
      text += string_at(b, "text", "text block");
    } else if (type == "thinking") {
      only_keys(b, {"type", "thinking", "signature"}, "a thinking block");
      thinking += string_at(b, "thinking", "thinking block");
    } else if (type == "tool_use") {
      only_keys(b, {"type", "id", "name", "input", "cache_control"}, "a tool_use block");
      const json input = b.value("input", json::object());
      if (!input.is_object()) bad("input", "tool_use.input must be an object");
      calls.push_back({{"id", string_at(b, "id", "tool_use")}, {"type", "function"},
                       {"function", {{"name", string_at(b, "name", "tool_use")}, {"arguments", input.dump()}}}});
    } else {
      bad("messages", "assistant content block of type '" + type + "' is not supported (text, thinking and tool_use are)");
    }
  }
  json m = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  if (!calls.empty()) m["tool_calls"] = calls;
  out.push_back(m);
}

json translate_messages(const json& body) {
  json out = json::array();
  if (auto it = body.find("system"); it != body.end() && !it->is_null())
    out.push_back({{"role", "system"}, {"content", text_of(*it, "system")}});
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) bad("messages", "'messages' (a non-empty list) is required");
  for (const auto& m : *it) {
    object_at(m, "messages[]");
    only_keys(m, {"role", "content"}, "a message");
    const std::string role = string_at(m, "role", "message");
    if (!m.contains("content")) bad("content", "a message needs 'content'");
    if (role == "user") translate_user(m["content"], out);
    else if (role == "assistant") translate_assistant(m["content"], out);
    else bad("role", "a message's role must be \"user\" or \"assistant\", got \"" + role + "\"");
  }
  return out;
}

// Anthropic tools (name, description, input_schema) as chat function tools.
json translate_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be a list");
  json out = json::array();
  for (const auto& t : tools) {
    object_at(t, "tools[]");
    only_keys(t, {"name", "description", "input_schema", "type", "cache_control"}, "a tool");
    if (t.contains("type") && t["type"] != "custom") bad("tools", "only custom tools (name, input_schema) are supported");
    json fn = {{"name", string_at(t, "name", "tool")}};
    if (t.contains("description")) fn["description"] = string_at(t, "description", "tool");
    const auto s = t.find("input_schema");
    if (s == t.end() || !s->is_object()) bad("input_schema", "tool '" + fn["name"].get<std::string>() + "' needs an 'input_schema' object");
    fn["parameters"] = *s;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

// auto / any / tool / none as chat's "auto" / "required" / a named function / "none";
// disable_parallel_tool_use as parallel_tool_calls false.
void translate_tool_choice(const json& tc, json& chat) {
  object_at(tc, "tool_choice");
  only_keys(tc, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
  const std::string type = string_at(tc, "type", "tool_choice");
  if (type == "auto") chat["tool_choice"] = "auto";
  else if (type == "any") chat["tool_choice"] = "required";
  else if (type == "none") chat["tool_choice"] = "none";
  else if (type == "tool") chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_at(tc, "name", "tool_choice")}}}};
  else bad("tool_choice", "tool_choice.type must be auto, any, tool or none, got \"" + type + "\"");
  if (type != "tool" && tc.contains("name")) bad("name", "tool_choice.name goes with type \"tool\" only");
  if (auto d = tc.find("disable_parallel_tool_use"); d != tc.end()) {
    if (!d->is_boolean()) bad("disable_parallel_tool_use", "disable_parallel_tool_use must be a boolean");
    if (d->get<bool>()) chat["parallel_tool_calls"] = false;
  }
}

// The sampling and stop fields, copied under their chat names (parse_request checks ranges).
void translate_generation(const json& body, json& chat) {
  const auto mt = body.find("max_tokens");
  if (mt == body.end() || !mt->is_number_integer() || mt->get<int64_t>() < 1)
    bad("max_tokens", "'max_tokens' (an integer >= 1) is required");
  chat["max_tokens"] = *mt;
  for (const char* k : {"temperature", "top_p", "top_k"})
    if (auto it = body.find(k); it != body.end()) chat[k] = *it;
  if (auto it = body.find("stop_sequences"); it != body.end()) {
    if (!it->is_array()) bad("stop_sequences", "'stop_sequences' must be a list of strings");
    chat["stop"] = *it;
  }
  if (auto it = body.find("metadata"); it != body.end()) {  // accepted: user_id is for abuse tracking
    object_at(*it, "metadata");
    only_keys(*it, {"user_id"}, "metadata");
  }
}

// Extended thinking as the chat template's enable_thinking (Qwen3's templates open "<think>" with
// it, and the reasoning parser makes thinking blocks of what follows). budget_tokens is checked as
// Anthropic does against max_tokens, which bounds the thinking; it is not a separate limit.
void translate_thinking(const json& t, json& chat) {
  object_at(t, "thinking");
  only_keys(t, {"type", "budget_tokens"}, "thinking");
  const std::string type = string_at(t, "type", "thinking");
  if (type == "enabled") {
    const auto b = t.find("budget_tokens");
    if (b == t.end() || !b->is_number_integer() || b->get<int64_t>() < 1 ||
        (chat.contains("max_tokens") && b->get<int64_t>() >= chat["max_tokens"].get<int64_t>()))
      bad("budget_tokens", "thinking.budget_tokens must be an integer >= 1 and below max_tokens");
  } else if (type != "disabled") {
    bad("thinking", "thinking.type must be \"enabled\" or \"disabled\", got \"" + type + "\"");
  } else if (t.contains("budget_tokens")) {
    bad("budget_tokens", "thinking.budget_tokens goes with type \"enabled\" only");
  }
  chat["chat_template_kwargs"] = {{"enable_thinking", type == "enabled"}};
}

}  // namespace

AnthropicRequest translate_anthropic_request(std::string_view text, bool count_tokens) {
  const json body = parse_json_limited(text);
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  static const std::set<std::string> messages_keys = {"model", "messages", "system", "max_tokens", "stop_sequences",
                                                      "temperature", "top_p", "top_k", "metadata", "stream", "tools",
                                                      "tool_choice", "thinking"};
  static const std::set<std::string> count_keys = {"model", "messages", "system", "tools", "tool_choice", "thinking"};
  only_keys(body, count_tokens ? count_keys : messages_keys, "the request");
  AnthropicRequest out;
  json& chat = out.chat_body;
  chat = json::object();
  chat["model"] = string_at(body, "model", "request");
  chat["messages"] = translate_messages(body);
  if (auto it = body.find("tools"); it != body.end()) chat["tools"] = translate_tools(*it);
  if (auto it = body.find("tool_choice"); it != body.end()) translate_tool_choice(*it, chat);
  if (!count_tokens) translate_generation(body, chat);
  if (auto it = body.find("thinking"); it != body.end()) translate_thinking(*it, chat);
  if (count_tokens) return out;
  if (auto it = body.find("stream"); it != body.end()) {
    if (!it->is_boolean()) bad("stream", "'stream' must be a boolean");
    out.stream = it->get<bool>();
  }
  if (out.stream) {  // the usage chunk gives message_delta its output_tokens
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};
  }
  return out;
}

json anthropic_error_json(const ApiError& e) {
  std::string type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: if (e.status >= 500) type = "api_error";
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

std::string anthropic_stop_reason(const std::string& finish_reason, const json& stop_reason, json* stop_sequence) {
  *stop_sequence = nullptr;
  if (finish_reason == "length") return "max_tokens";
  if (finish_reason == "tool_calls") return "tool_use";
  if (stop_reason.is_string()) {  // a stop string (a stop token id is the model's own end)
    *stop_sequence = stop_reason;
    return "stop_sequence";
  }
  return "end_turn";
}

json anthropic_message(const json& chat_response, const std::string& id) {
  const json& choice = chat_response.at("choices").at(0);
  const json& msg = choice.at("message");
  json content = json::array();
  if (auto r = msg.find("reasoning_content"); r != msg.end() && r->is_string() && !r->get<std::string>().empty())
    content.push_back({{"type", "thinking"}, {"thinking", *r}, {"signature", ""}});
  if (auto c = msg.find("content"); c != msg.end() && c->is_string() && !c->get<std::string>().empty())
    content.push_back({{"type", "text"}, {"text", *c}});
  bool called = false;
  if (auto calls = msg.find("tool_calls"); calls != msg.end() && calls->is_array())
    for (const auto& tc : *calls) {
      called = true;
      content.push_back({{"type", "tool_use"}, {"id", tc.at("id")}, {"name", tc.at("function").at("name")},
                         {"input", json::parse(tc.at("function").at("arguments").get<std::string>())}});
    }
  json stop_sequence;
  std::string reason = anthropic_stop_reason(choice.at("finish_reason").get<std::string>(), choice.value("stop_reason", json()), &stop_sequence);
  if (called) reason = "tool_use";  // a forced named call ends with "stop" in chat's terms
  const json& usage = chat_response.at("usage");
  return {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", chat_response.at("model")},
          {"content", content}, {"stop_reason", reason}, {"stop_sequence", stop_sequence},
          {"usage", {{"input_tokens", usage.at("prompt_tokens")}, {"output_tokens", usage.at("completion_tokens")}}}};
}

}  // namespace fathom::server
