#include "server/openai_responses.h"

#include <set>

#include "server/json_fields.h"
#include "server/request_parser.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& msg) { bad_field(param, msg); }

// Refuses keys outside `allowed`, naming this endpoint.
void only(const json& obj, const std::set<std::string>& allowed, const std::string& where) {
  only_keys(obj, allowed, where, "/v1/responses");
}

// A message's content: a string, or parts of `part_type` (input_text for user, system and
// developer turns, output_text for the assistant's), joined.
std::string content_text(const json& content, const std::string& role) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad("content", "a message's content must be a string or a list of content parts");
  const std::string want = role == "assistant" ? "output_text" : "input_text";
  std::string out;
  for (const auto& p : content) {
    object_at(p, "content[]");
    const std::string type = type_of(p);
    if (type != want)
      bad("content", "content part of type '" + type + "' in a " + role + " message is not supported (" + want + " is)");
    only(p, want == "output_text" ? std::set<std::string>{"type", "text", "annotations", "logprobs"}
                                       : std::set<std::string>{"type", "text"},
              "a content part");
    out += string_at(p, "text", "content part");
  }
  return out;
}

// Input items as chat messages: messages in order, consecutive function calls as one assistant
// turn's tool_calls, their outputs as tool messages, a reasoning item as the next assistant
// turn's reasoning_content.
json translate_input(const json& input) {
  json out = json::array();
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input}});
    return out;
  }
  if (!input.is_array() || input.empty()) bad("input", "'input' must be a string or a non-empty list of items");
  std::string reasoning;
  auto assistant_turn = [&]() -> json& {  // the assistant turn function calls join (its text's, if any)
    if (out.empty() || out.back()["role"] != "assistant") {
      json m = {{"role", "assistant"}, {"content", ""}};
      if (!reasoning.empty()) m["reasoning_content"] = reasoning;
      reasoning.clear();
      out.push_back(std::move(m));
    }
    if (!out.back().contains("tool_calls")) out.back()["tool_calls"] = json::array();
    return out.back();
  };
  for (const auto& item : input) {
    object_at(item, "input[]");
    const std::string type = item.contains("type") ? type_of(item) : "message";
    if (type == "message") {
      only(item, {"type", "role", "content", "id", "status"}, "a message item");
      std::string role = string_at(item, "role", "message");
      if (role == "developer") role = "system";
      if (role != "user" && role != "system" && role != "assistant")
        bad("role", "a message's role must be user, system, developer or assistant, got \"" + role + "\"");
      if (!item.contains("content")) bad("content", "a message item needs 'content'");
      json m = {{"role", role}, {"content", content_text(item["content"], role)}};
      if (role == "assistant" && !reasoning.empty()) m["reasoning_content"] = reasoning, reasoning.clear();
      out.push_back(std::move(m));
    } else if (type == "function_call") {
      only(item, {"type", "call_id", "name", "arguments", "id", "status"}, "a function_call item");
      assistant_turn()["tool_calls"].push_back(
          {{"id", string_at(item, "call_id", "function_call")}, {"type", "function"},
           {"function", {{"name", string_at(item, "name", "function_call")},
                         {"arguments", string_at(item, "arguments", "function_call")}}}});
    } else if (type == "function_call_output") {
      only(item, {"type", "call_id", "output", "id", "status"}, "a function_call_output item");
      if (!item.contains("output")) bad("output", "a function_call_output item needs 'output'");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", string_at(item, "call_id", "function_call_output")},
                     {"content", content_text(item["output"], "tool")}});
    } else if (type == "reasoning") {
      only(item, {"type", "id", "summary", "content", "encrypted_content", "status"}, "a reasoning item");
      if (item.contains("encrypted_content") && !item["encrypted_content"].is_null())
        bad("encrypted_content", "encrypted reasoning is not supported (this server never sends it)");
      // The text the model wrote (content), else its summary.
      for (const char* key : {"content", "summary"}) {
        const auto parts = item.find(key);
        if (parts == item.end() || parts->is_null()) continue;
        if (!parts->is_array()) bad(key, std::string("reasoning.") + key + " must be a list");
        std::string text;
        for (const auto& p : *parts) text += string_at(object_at(p, "reasoning part"), "text", "reasoning part");
        if (!text.empty()) {
          reasoning += text;
          break;
        }
      }
    } else {
      bad("input", "input item of type '" + type + "' is not supported (message, function_call, "
                   "function_call_output and reasoning are)");
    }
  }
  return out;
}

// Responses function tools (flat: type, name, description, parameters, strict) as chat tools.
json translate_tools(const json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be a list");
  json out = json::array();
  for (const auto& t : tools) {
    object_at(t, "tools[]");
    if (type_of(t) != "function") bad("tools", "tool of type '" + type_of(t) + "' is not supported (function is)");
    only(t, {"type", "name", "description", "parameters", "strict"}, "a function tool");
    json fn = {{"name", string_at(t, "name", "tool")}};
    for (const char* k : {"description", "parameters", "strict"})
      if (auto it = t.find(k); it != t.end() && !it->is_null()) fn[k] = *it;
    out.push_back({{"type", "function"}, {"function", fn}});
  }
  return out;
}

json translate_tool_choice(const json& tc) {
  if (tc.is_string()) {
    const std::string s = tc.get<std::string>();
    if (s != "auto" && s != "none" && s != "required") bad("tool_choice", "tool_choice must be auto, none or required");
    return tc;
  }
  object_at(tc, "tool_choice");
  only(tc, {"type", "name"}, "tool_choice");
  if (type_of(tc) != "function") bad("tool_choice", "tool_choice.type must be \"function\"");
  return {{"type", "function"}, {"function", {{"name", string_at(tc, "name", "tool_choice")}}}};
}

// text.format as response_format: text, json_object, or json_schema (through the grammar engine).
json translate_text(const json& text, json& chat) {
  object_at(text, "text");
  only(text, {"format"}, "text");
  const auto f = text.find("format");
  if (f == text.end() || f->is_null()) return text;
  object_at(*f, "text.format");
  const std::string type = type_of(*f);
  if (type == "text") {
    only(*f, {"type"}, "text.format");
  } else if (type == "json_object") {
    only(*f, {"type"}, "text.format");
    chat["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    only(*f, {"type", "name", "schema", "strict", "description"}, "text.format");
    json js = {{"name", string_at(*f, "name", "text.format")}};
    const auto s = f->find("schema");
    if (s == f->end() || !s->is_object()) bad("schema", "text.format.schema must be an object");
    js["schema"] = *s;
    for (const char* k : {"strict", "description"})
      if (auto it = f->find(k); it != f->end() && !it->is_null()) js[k] = *it;
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
  } else {
    bad("text.format", "text.format.type must be text, json_object or json_schema, got \"" + type + "\"");
  }
  return text;
}

// reasoning.effort: "none" and "minimal" turn the template's thinking off, the rest on (the model
// has no finer budget); summaries are not made here, so reasoning.summary is refused.
json translate_reasoning(const json& r, json& chat) {
  object_at(r, "reasoning");
  only(r, {"effort", "summary"}, "reasoning");
  if (auto s = r.find("summary"); s != r.end() && !s->is_null())
    bad("summary", "reasoning summaries are not supported: reasoning comes as reasoning_text content");
  const auto e = r.find("effort");
  if (e == r.end() || e->is_null()) return {{"effort", nullptr}, {"summary", nullptr}};
  static const std::set<std::string> efforts = {"none", "minimal", "low", "medium", "high", "xhigh"};
  if (!e->is_string() || !efforts.count(e->get<std::string>()))
    bad("effort", "reasoning.effort must be none, minimal, low, medium, high or xhigh");
  const bool think = *e != "none" && *e != "minimal";
  chat["chat_template_kwargs"] = {{"enable_thinking", think}};
  return {{"effort", *e}, {"summary", nullptr}};
}

}  // namespace

void ResponseStore::put(const std::string& id, json messages) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  order_.push_front(id);
  map_[id] = {std::move(messages), order_.begin()};
  while (map_.size() > capacity_) {
    map_.erase(order_.back());
    order_.pop_back();
  }
}

json ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second.second);  // most recently used
  return it->second.first;
}

ResponsesRequest translate_responses_request(std::string_view text, ResponseStore& store) {
  const json body = parse_json_limited(text);
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  only(body, {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
                   "max_output_tokens", "temperature", "top_p", "stream", "store", "previous_response_id", "metadata",
                   "user", "reasoning", "truncation"},
            "the request");
  ResponsesRequest out;
  json& chat = out.chat_body;
  json& echo = out.echo;
  chat = json::object();
  chat["model"] = string_at(body, "model", "request");
  if (!body.contains("input")) bad("input", "'input' is required");
  json messages = json::array();
  json prev = nullptr;
  if (auto p = body.find("previous_response_id"); p != body.end() && !p->is_null()) {
    if (!p->is_string()) bad("previous_response_id", "previous_response_id must be a string");
    if (store.capacity() == 0)
      bad("previous_response_id", "previous_response_id needs the response store, which is off (--responses-store-size 0)");
    messages = store.get(p->get<std::string>());
    if (messages.is_null())
      bad("previous_response_id", "no stored response '" + p->get<std::string>() + "' (unknown, not stored, or evicted)");
    prev = *p;
  }
  for (const auto& m : translate_input(body["input"])) messages.push_back(m);
  out.conversation = messages;
  json with_system = json::array();
  json instructions = nullptr;
  if (auto it = body.find("instructions"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) bad("instructions", "'instructions' must be a string");
    instructions = *it;
    with_system.push_back({{"role", "system"}, {"content", *it}});
  }
  for (const auto& m : messages) with_system.push_back(m);
  chat["messages"] = with_system;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) chat["tools"] = translate_tools(*it);
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) chat["tool_choice"] = translate_tool_choice(*it);
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) bad("parallel_tool_calls", "parallel_tool_calls must be a boolean");
    chat["parallel_tool_calls"] = *it;
  }
  json text_echo = {{"format", {{"type", "text"}}}};
  if (auto it = body.find("text"); it != body.end() && !it->is_null()) {
    text_echo = translate_text(*it, chat);
    if (!text_echo.contains("format") || text_echo["format"].is_null()) text_echo = {{"format", {{"type", "text"}}}};
  }
  if (auto it = body.find("max_output_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
      bad("max_output_tokens", "max_output_tokens must be an integer >= 1");
    chat["max_tokens"] = *it;
  }
  for (const char* k : {"temperature", "top_p"})
    if (auto it = body.find(k); it != body.end() && !it->is_null()) chat[k] = *it;
  json reasoning_echo = {{"effort", nullptr}, {"summary", nullptr}};
  if (auto it = body.find("reasoning"); it != body.end() && !it->is_null()) reasoning_echo = translate_reasoning(*it, chat);
  if (auto it = body.find("metadata"); it != body.end() && !it->is_null()) {
    object_at(*it, "metadata");
    for (auto kv = it->begin(); kv != it->end(); ++kv)
      if (!kv.value().is_string()) bad("metadata", "metadata values must be strings");
  }
  if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string()) bad("user", "'user' must be a string");
  if (auto it = body.find("truncation"); it != body.end() && !it->is_null() && *it != "disabled")
    bad("truncation", "truncation must be \"disabled\" (prompts past the context limit are refused)");
  for (const char* k : {"stream", "store"})
    if (auto it = body.find(k); it != body.end() && !it->is_null() && !it->is_boolean())
      bad(k, std::string("'") + k + "' must be a boolean");
  out.stream = body.value("stream", false);
  out.store = body.contains("store") && !body["store"].is_null() ? body["store"].get<bool>() : true;
  if (out.stream) {
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};
  }
  echo["instructions"] = instructions;
  echo["max_output_tokens"] = body.value("max_output_tokens", json());
  echo["metadata"] = body.contains("metadata") && !body["metadata"].is_null() ? body["metadata"] : json::object();
  echo["parallel_tool_calls"] = body.value("parallel_tool_calls", json(true));
  echo["previous_response_id"] = prev;
  echo["reasoning"] = reasoning_echo;
  echo["store"] = out.store;
  echo["temperature"] = body.value("temperature", json(1.0));
  echo["top_p"] = body.value("top_p", json(1.0));
  echo["text"] = text_echo;
  echo["tool_choice"] = body.value("tool_choice", json("auto"));
  echo["tools"] = body.value("tools", json::array());
  echo["truncation"] = "disabled";
  echo["user"] = body.value("user", json());
  return out;
}

json responses_output(const json& chat_response, const std::function<std::string(const char*)>& new_id) {
  const json& msg = chat_response.at("choices").at(0).at("message");
  json output = json::array();
  if (auto r = msg.find("reasoning_content"); r != msg.end() && r->is_string() && !r->get<std::string>().empty())
    output.push_back({{"id", new_id("rs_")}, {"type", "reasoning"}, {"summary", json::array()},
                      {"content", json::array({{{"type", "reasoning_text"}, {"text", *r}}})}, {"status", "completed"}});
  if (auto c = msg.find("content"); c != msg.end() && c->is_string() && !c->get<std::string>().empty())
    output.push_back({{"id", new_id("msg_")}, {"type", "message"}, {"status", "completed"}, {"role", "assistant"},
                      {"content", json::array({{{"type", "output_text"}, {"text", *c}, {"annotations", json::array()},
                                                {"logprobs", json::array()}}})}});
  if (auto calls = msg.find("tool_calls"); calls != msg.end() && calls->is_array())
    for (const auto& tc : *calls)
      output.push_back({{"id", new_id("fc_")}, {"type", "function_call"}, {"status", "completed"},
                        {"call_id", tc.at("id")}, {"name", tc.at("function").at("name")},
                        {"arguments", tc.at("function").at("arguments")}});
  return output;
}

json responses_usage(const json& u) {
  const int64_t in = u.value("prompt_tokens", int64_t(0)), out = u.value("completion_tokens", int64_t(0));
  int64_t cached = 0;
  if (auto d = u.find("prompt_tokens_details"); d != u.end() && d->is_object()) cached = d->value("cached_tokens", int64_t(0));
  return {{"input_tokens", in}, {"input_tokens_details", {{"cached_tokens", cached}}}, {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", 0}}}, {"total_tokens", in + out}};
}

json responses_object(const std::string& id, int64_t created_at, const std::string& model, const json& echo,
                      const std::string& status, json output, const json& usage) {
  json r = {{"id", id}, {"object", "response"}, {"created_at", created_at}, {"status", status}, {"error", nullptr}};
  r["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json();
  r["model"] = model;
  r["output"] = std::move(output);
  for (auto it = echo.begin(); it != echo.end(); ++it) r[it.key()] = it.value();
  r["usage"] = usage;
  return r;
}

json responses_conversation(json messages, const json& output) {
  json turn = {{"role", "assistant"}, {"content", ""}};
  json calls = json::array();
  for (const auto& item : output) {
    const std::string type = item.value("type", "");
    if (type == "reasoning") {
      std::string text;
      for (const auto& p : item.value("content", json::array())) text += p.value("text", "");
      turn["reasoning_content"] = text;
    } else if (type == "message") {
      std::string text;
      for (const auto& p : item.value("content", json::array())) text += p.value("text", "");
      turn["content"] = text;
    } else if (type == "function_call") {
      calls.push_back({{"id", item.at("call_id")}, {"type", "function"},
                       {"function", {{"name", item.at("name")}, {"arguments", item.at("arguments")}}}});
    }
  }
  if (!calls.empty()) turn["tool_calls"] = calls;
  messages.push_back(turn);
  return messages;
}

}  // namespace fathom::server
