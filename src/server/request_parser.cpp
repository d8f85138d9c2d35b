#include "server/request_parser.h"

#include <algorithm>
#include <limits>
#include <set>

#include "chat/chat_template.h"
#include "grammar/compiler.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

namespace {

struct TooDeep {};

// The nesting limit is checked by the parser's callback as each container opens, so a hostile
// document is refused before a deep tree exists. Invalid JSON gives a discarded value.
json parse_json_depth(std::string_view text, bool& too_deep) {
  too_deep = false;
  try {
    return json::parse(
        text.begin(), text.end(),
        [](int depth, json::parse_event_t ev, json&) {
          if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) && depth >= kMaxJsonDepth)
            throw TooDeep{};
          return true;
        },
        /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    too_deep = true;
    return json(json::value_t::discarded);
  }
}

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  throw ApiError{400, msg, param, code};
}

const std::vector<std::string> kCommonFields = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream", "stream_options", "stop",
    "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "logit_bias",
    "min_tokens", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "return_token_ids", "logprobs",
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    // SGLang's, sent by its gateway and by vLLM's router on every request (docs/api.md).
    "no_stop_trim", "return_hidden_states"};

std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<const char*> more) {
  for (const char* m : more) a.emplace_back(m);
  return a;
}

// Fields whose supported values are a subset of what OpenAI allows: the rest is refused by name.
void check_partially_supported(const json& b, bool chat) {
  if (!chat) {
    if (auto it = b.find("best_of"); it != b.end() && !it->is_null()) {
      const int64_t n = get_int(b, "n", 1, 128).value_or(1);
      if (get_int(b, "best_of", 1, 128).value() != n)
        bad("best_of", "'best_of' other than n is not supported (it would rank n of best_of sequences)", "unsupported_value");
    }
    return;
  }
  if (auto it = b.find("tool_choice"); it != b.end() && !it->is_null()) {
    const bool named = it->is_object() && it->value("type", json()) == "function" && it->contains("function") &&
                       (*it)["function"].is_object() && (*it)["function"].contains("name") &&
                       (*it)["function"]["name"].is_string();
    if (!named && (!it->is_string() || (*it != "auto" && *it != "none" && *it != "required")))
      bad("tool_choice",
          "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
          "{\"name\": ...}} (got " + it->dump() + ")",
          "unsupported_value");
  }
  // false is enforced by the grammar of tool_choice "required" (one call); elsewhere it cannot be.
  if (auto v = get_bool(b, "parallel_tool_calls"); v && !*v) {
    const auto tc = b.find("tool_choice");
    const bool forced = tc != b.end() && (*tc == "required" || tc->is_object());
    if (!forced)
      bad("parallel_tool_calls",
          "'parallel_tool_calls': false is enforced only with tool_choice \"required\" or a named function "
          "(under \"auto\" the model may call several tools)",
          "unsupported_value");
  }
}

// The fields SGLang's and vLLM's routers add to every body (docs/deploy.md): no_stop_trim keeps
// the stop string (vLLM's include_stop_str_in_output); hidden states are not computed here.
void parse_router_fields(const json& b, bool chat, ParsedRequest& out) {
  if (get_bool(b, "no_stop_trim").value_or(false)) out.common.params.include_stop_str_in_output = true;
  if (get_bool(b, "return_hidden_states").value_or(false))
    bad("return_hidden_states", "'return_hidden_states': true is not supported (hidden states are not returned)",
        "unsupported_value");
  if (!chat) return;
  out.reasoning.separate = get_bool(b, "separate_reasoning").value_or(true);
  out.reasoning.stream = get_bool(b, "stream_reasoning").value_or(true);
  out.reasoning.include = get_bool(b, "include_reasoning").value_or(true);
}

void check_fields(const json& b, bool chat, bool allow_fault) {
  const auto& accepted = accepted_fields(chat);
  const auto& ignored = ignored_fields();
  std::vector<std::string> unknown;
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(accepted.begin(), accepted.end(), k) != accepted.end()) continue;
    if (std::find(ignored.begin(), ignored.end(), k) != ignored.end()) continue;
    if (k == "fathom_fault" && allow_fault) continue;
    unknown.push_back(k);
  }
  if (unknown.empty()) return;
  std::string names;
  for (const auto& u : unknown) names += (names.empty() ? "'" : ", '") + u + "'";
  bad(unknown.front(), std::string("unsupported field") + (unknown.size() > 1 ? "s " : " ") + names + " for " +
                           (chat ? "/v1/chat/completions" : "/v1/completions") + " (see docs/api.md)",
      "unknown_parameter");
}

FaultInjection parse_fault(const json& b) {
  FaultInjection f;
  auto it = b.find("fathom_fault");
  if (it == b.end() || it->is_null()) return f;
  if (!it->is_object()) bad("fathom_fault", "'fathom_fault' must be an object {site, after_tokens}", "invalid_type");
  const auto site = get_string(*it, "site").value_or("");
  f.site = fault_site_from_name(site);
  if (f.site == FaultSite::None) bad("fathom_fault", "'fathom_fault.site' must be sample, detokenize, stop or forward");
  f.after_tokens = int(get_int(*it, "after_tokens", 0, 1 << 30).value_or(0));
  return f;
}

// Keys a chat template reads from a message; anything else is dropped before rendering.
const std::set<std::string> kMessageKeys = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"};

json sanitize_message(const json& m) {
  if (!m.is_object()) bad("messages", "each message must be an object", "invalid_type");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) bad("messages", "each message needs a string 'role'");
  static const std::set<std::string> roles = {"system", "user", "assistant", "tool", "developer"};
  if (!roles.count(role->get<std::string>())) bad("messages", "unknown message role '" + role->get<std::string>() + "'");
  json out = json::object();
  for (auto it = m.begin(); it != m.end(); ++it)
    if (kMessageKeys.count(it.key())) out[it.key()] = it.value();
  if (auto content = m.find("content"); content != m.end() && content->is_array()) {
    std::string joined;
    for (const auto& part : *content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        bad("messages", "only text content parts are supported");
      if (!joined.empty()) joined += "\n";
      joined += part["text"].get<std::string>();
    }
    out["content"] = joined;
  } else if (content != m.end() && !content->is_string() && !content->is_null()) {
    bad("messages", "message 'content' must be a string, a list of parts or null", "invalid_type");
  }
  for (const char* k : {"name", "tool_call_id", "reasoning_content"})
    if (auto it = out.find(k); it != out.end() && !it->is_string() && !it->is_null())
      bad("messages", std::string("message '") + k + "' must be a string", "invalid_type");
  if (auto tc = out.find("tool_calls"); tc != out.end() && !tc->is_null()) {
    if (!tc->is_array()) bad("messages", "message 'tool_calls' must be a list", "invalid_type");
    for (auto& call : *tc) {
      if (!call.is_object()) bad("messages", "each tool call must be an object", "invalid_type");
      auto fn = call.find("function");
      if (fn == call.end() || !fn->is_object()) bad("messages", "each tool call needs a 'function' object", "invalid_value");
      // OpenAI sends arguments as a JSON string; templates iterate them as a mapping (as vLLM does).
      if (auto args = fn->find("arguments"); args != fn->end() && args->is_string()) {
        bool too_deep = false;
        json parsed = parse_json_depth(args->get<std::string>(), too_deep);
        if (too_deep) bad("messages", "tool call arguments nest deeper than " + std::to_string(kMaxJsonDepth) + " levels");
        if (!parsed.is_discarded() && parsed.is_object()) *args = std::move(parsed);
      }
    }
  }
  return out;
}

std::vector<int32_t> encode_text(const RequestContext& ctx, const std::string& text, const char* param, bool add_special) {
  if (!ctx.tokenizer)
    bad(param, "text prompts need a tokenizer (server runs with --skip-tokenizer-init): send token ids");
  std::vector<uint32_t> ids;
  try {
    ids = ctx.tokenizer->encode(text, add_special);
  } catch (const std::exception& e) {
    bad(param, std::string("cannot tokenize: ") + e.what());
  }
  return {ids.begin(), ids.end()};
}

std::vector<int32_t> token_ids(const json& arr, int64_t vocab) {
  std::vector<int32_t> v;
  for (const auto& e : arr) {
    if (!e.is_number_integer()) bad("prompt", "token id prompts must hold integers", "invalid_type");
    const int64_t t = e.is_number_unsigned() && e.get<uint64_t>() > uint64_t(vocab) ? vocab : e.get<int64_t>();
    if (t < 0 || t >= vocab)
      bad("prompt", "token id " + e.dump() + " is out of range [0, " + std::to_string(vocab) + ")");
    v.push_back(int32_t(t));
  }
  return v;
}

// vLLM's continue_final_message (transformers' rule): the prompt ends where the last message's
// text last appears, so the model continues that assistant message instead of closing it.
std::string open_final_message(const std::string& prompt, const json& last) {
  const json& content = last.contains("content") ? last["content"] : json();
  std::string text = content.is_string() ? content.get<std::string>() : "";
  for (int pass = 0; pass < 2 && !text.empty(); ++pass) {
    if (size_t at = prompt.rfind(text); at != std::string::npos) return prompt.substr(0, at + text.size());
    // Templates may strip the message's surrounding whitespace.
    const size_t b0 = text.find_first_not_of(" \t\r\n"), e0 = text.find_last_not_of(" \t\r\n");
    text = b0 == std::string::npos ? "" : text.substr(b0, e0 - b0 + 1);
  }
  bad("continue_final_message", "'continue_final_message': the last message's text is empty or not in the rendered prompt");
}

void parse_chat_prompt(const json& b, const RequestContext& ctx, ParsedRequest& out) {
  if (!ctx.tokenizer) bad("messages", "chat completions need a tokenizer (server runs with --skip-tokenizer-init)", "");
  if (!ctx.chat_template) bad("messages", "the model has no chat template: " + ctx.template_error, "");
  auto it = b.find("messages");
  if (it == b.end() || it->is_null()) bad("messages", "'messages' is required", "missing_required_parameter");
  if (!it->is_array()) bad("messages", "'messages' must be a list", "invalid_type");
  if (it->empty()) bad("messages", "'messages' must not be empty");
  json msgs = json::array();
  for (const auto& m : *it) msgs.push_back(sanitize_message(m));
  json tools = nullptr;
  json choice = b.value("tool_choice", json("auto"));
  if (choice.is_null()) choice = "auto";
  const bool none = choice == "none";
  if (none) out.tool_choice = ParsedRequest::ToolChoice::None;
  if (choice == "required") out.tool_choice = ParsedRequest::ToolChoice::Required;
  if (choice.is_object()) {
    out.tool_choice = ParsedRequest::ToolChoice::Named;
    out.tool_choice_name = choice["function"]["name"].get<std::string>();
  }
  if (auto t = b.find("tools"); t != b.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be a list", "invalid_type");
    for (const auto& tool : *t)
      if (!tool.is_object()) bad("tools", "each tool must be an object", "invalid_type");
    if (!t->empty() && !none) tools = *t;  // tool_choice "none": the model is not told about tools
  }
  const bool forced = out.tool_choice == ParsedRequest::ToolChoice::Required ||
                      out.tool_choice == ParsedRequest::ToolChoice::Named;
  if (forced && tools.is_null()) bad("tool_choice", "'tool_choice' " + choice.dump() + " needs a non-empty 'tools' list");
  // As vLLM: tools under tool_choice "auto" (the default with tools) need the server's parser,
  // else the calls would come back as text.
  if (!tools.is_null() && out.tool_choice == ParsedRequest::ToolChoice::Auto && !ctx.auto_tool_choice)
    bad("tool_choice",
        "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set "
        "(or send tool_choice \"none\")",
        "invalid_value");
  out.tools = tools;
  json kwargs = json::object();
  if (auto k = b.find("chat_template_kwargs"); k != b.end() && !k->is_null()) {
    if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object", "invalid_type");
    kwargs = *k;
  }
  const bool cont = get_bool(b, "continue_final_message").value_or(false);
  const auto add_gen_given = get_bool(b, "add_generation_prompt");
  if (cont && add_gen_given.value_or(false))
    bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (cont && msgs.back().value("role", "") != "assistant")
    bad("continue_final_message", "'continue_final_message' needs the last message to be the assistant's");
  const bool add_gen = add_gen_given.value_or(!cont);
  try {
    out.rendered_prompt = ctx.chat_template->render(msgs, tools, add_gen, kwargs, ctx.special_tokens);
  } catch (const std::exception& e) {
    bad("messages", std::string("chat template error: ") + e.what(), "");
  }
  if (cont) out.rendered_prompt = open_final_message(out.rendered_prompt, msgs.back());
  out.prompts.push_back(encode_text(ctx, out.rendered_prompt, "messages", false));
}

// Fill-in-the-middle prompt from the tokenizer's FIM tokens (Qwen's <|fim_prefix|> ...).
std::string fim_prompt(const RequestContext& ctx, const std::string& prefix, const std::string& suffix) {
  for (const char* t : {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"})
    if (!ctx.tokenizer || !ctx.tokenizer->token_to_id(t))
      bad("suffix", "'suffix' is not supported by this model: its tokenizer has no fill-in-the-middle tokens", "unsupported_value");
  return "<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>";
}

void parse_completion_prompt(const json& b, const RequestContext& ctx, ParsedRequest& out) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) bad("prompt", "'prompt' is required", "missing_required_parameter");
  const auto suffix = get_string(b, "suffix");
  out.echo = get_bool(b, "echo").value_or(false);
  if (out.echo && out.common.params.logprobs >= 0)
    bad("echo", "'echo' with 'logprobs' is not supported (it needs the prompt's logprobs)", "unsupported_value");
  if (out.echo && !ctx.tokenizer) bad("echo", "'echo' needs a tokenizer (server runs with --skip-tokenizer-init)");
  auto add_text = [&](const std::string& text) {
    const std::string full = suffix ? fim_prompt(ctx, text, *suffix) : text;
    out.prompts.push_back(encode_text(ctx, full, "prompt", true));
    if (out.echo) out.echo_texts.push_back(text);
  };
  auto add_ids = [&](const json& arr) {
    if (suffix) bad("suffix", "'suffix' needs a text prompt");
    out.prompts.push_back(token_ids(arr, ctx.vocab_size));
    if (out.echo) {
      const auto& p = out.prompts.back();
      out.echo_texts.push_back(ctx.tokenizer->decode(std::vector<uint32_t>(p.begin(), p.end()), false));
    }
  };
  const char* shape = "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists";
  if (it->is_string()) {
    add_text(it->get<std::string>());
  } else if (it->is_array()) {
    if (it->empty()) bad("prompt", "'prompt' must not be empty");
    const json& first = (*it)[0];
    if (first.is_string()) {
      for (const auto& e : *it) {
        if (!e.is_string()) bad("prompt", "'prompt' mixes strings and other values", "invalid_type");
        add_text(e.get<std::string>());
      }
    } else if (first.is_number()) {
      add_ids(*it);
    } else if (first.is_array()) {
      for (const auto& e : *it) {
        if (!e.is_array()) bad("prompt", "'prompt' mixes token lists and other values", "invalid_type");
        add_ids(e);
      }
    } else {
      bad("prompt", shape, "invalid_type");
    }
  } else {
    bad("prompt", shape, "invalid_type");
  }
  if (out.prompts.size() * size_t(out.common.n) > 256) bad("prompt", "too many prompts x n (at most 256)");
}

// max_tokens against the context: the same limit the engine enforces.
void finalize_lengths(ParsedRequest& out, const RequestContext& ctx) {
  CommonParams& cp = out.common;
  const char* prompt_param = out.chat ? "messages" : "prompt";
  int64_t max_tokens_all = std::numeric_limits<int32_t>::max();
  for (const auto& p : out.prompts) {
    const int64_t len = int64_t(p.size());
    if (len == 0) bad(prompt_param, "the prompt is empty");
    if (len > ctx.max_model_len)
      throw ApiError{400, "This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                              " tokens. However, your prompt has " + std::to_string(len) + " tokens.",
                     prompt_param, "context_length_exceeded"};
    const int64_t room = ctx.max_model_len - len;
    if (cp.max_tokens) {
      if (*cp.max_tokens > room)
        bad(out.chat ? "max_completion_tokens" : "max_tokens",
            "This model's maximum context length is " + std::to_string(ctx.max_model_len) + " tokens. However, you requested " +
                std::to_string(len + *cp.max_tokens) + " tokens (" + std::to_string(len) + " in the prompt, " +
                std::to_string(*cp.max_tokens) + " in the completion).",
            "context_length_exceeded");
      max_tokens_all = std::min(max_tokens_all, *cp.max_tokens);
    } else {
      if (room <= 0)
        bad(prompt_param, "the prompt leaves no room for a completion within max-model-len " + std::to_string(ctx.max_model_len),
            "context_length_exceeded");
      max_tokens_all = std::min(max_tokens_all, out.chat ? room : std::min<int64_t>(16, room));
    }
  }
  cp.params.max_tokens = int(max_tokens_all);
  if (cp.params.min_tokens > cp.params.max_tokens) cp.params.min_tokens = cp.params.max_tokens;
  cp.params.detokenize = ctx.tokenizer != nullptr;
}

}  // namespace

const std::vector<std::string>& accepted_fields(bool chat) {
  static const std::vector<std::string> completions = with(kCommonFields, {"prompt", "echo", "suffix", "best_of"});
  static const std::vector<std::string> chats =
      with(kCommonFields, {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                           "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                           "separate_reasoning", "stream_reasoning", "include_reasoning"});
  return chat ? chats : completions;
}

const std::vector<std::string>& ignored_fields() {
  // OpenAI bookkeeping that does not change the output (vLLM ignores them too).
  static const std::vector<std::string> ignored = {"user", "metadata", "store", "service_tier"};
  return ignored;
}

json parse_json_limited(std::string_view text, const char* what) {
  bool too_deep = false;
  json j = parse_json_depth(text, too_deep);
  if (too_deep)
    throw ApiError{400, std::string(what) + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", "", "invalid_json"};
  if (j.is_discarded()) throw ApiError{400, std::string(what) + " is not valid JSON", "", "invalid_json"};
  return j;
}

ParsedRequest parse_request(std::string_view body_text, bool chat, const RequestContext& ctx) {
  const json body = parse_json_limited(body_text);
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  check_fields(body, chat, ctx.allow_fault_injection);
  if (auto m = get_string(body, "model"))
    if (std::find(ctx.model_names.begin(), ctx.model_names.end(), *m) == ctx.model_names.end())
      throw ApiError{400, "The model `" + *m + "` does not exist.", "model", "model_not_found"};
  check_partially_supported(body, chat);
  ParsedRequest out;
  out.chat = chat;
  out.common = parse_common(body, chat, ctx.vocab_size, ctx.tokenizer != nullptr);
  if (ctx.allow_fault_injection) out.common.params.fault = parse_fault(body);
  parse_router_fields(body, chat, out);
  if (chat) parse_chat_prompt(body, ctx, out);
  else parse_completion_prompt(body, ctx, out);
  finalize_lengths(out, ctx);
  std::optional<StructuredOutputRequest> so = structured_output_request(body);
  if (out.tool_choice == ParsedRequest::ToolChoice::Required || out.tool_choice == ParsedRequest::ToolChoice::Named) {
    if (so) bad("tool_choice", "'tool_choice' " + body["tool_choice"].dump() + " cannot be combined with '" + so->field + "'");
    so = forced_tool_call_request(out.tools, out.tool_choice_name, get_bool(body, "parallel_tool_calls").value_or(true));
  }
  if (so) {
    if (!ctx.grammars) bad(so->field, "structured output needs the model's tokenizer (server runs with --skip-tokenizer-init)", "");
    try {
      so->spec.best_effort = ctx.schema_best_effort;
      so->spec.undeclared_keys = so->disable_additional_properties ? grammar::UndeclaredKeys::None : ctx.schema_undeclared_keys;
      out.common.params.grammar = ctx.grammars->compile(so->spec, &out.grammar_warnings);
    } catch (const std::exception& e) {
      bad(so->field, std::string("structured output: ") + e.what());
    }
  }
  return out;
}

TokenizeRequest parse_tokenize_request(std::string_view body_text, const RequestContext& ctx) {
  const json body = parse_json_limited(body_text);
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  const bool chat = body.contains("messages");
  static const std::vector<std::string> common = {"model", "add_special_tokens", "return_token_strs"};
  static const std::vector<std::string> chat_only = {"messages", "add_generation_prompt", "continue_final_message",
                                                     "chat_template_kwargs", "tools"};
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const bool known = std::find(common.begin(), common.end(), k) != common.end() ||
                       (chat ? std::find(chat_only.begin(), chat_only.end(), k) != chat_only.end() : k == "prompt");
    if (!known) bad(k, "unsupported field '" + k + "' for /tokenize (see docs/api.md)", "unknown_parameter");
  }
  if (auto m = get_string(body, "model"))
    if (std::find(ctx.model_names.begin(), ctx.model_names.end(), *m) == ctx.model_names.end())
      throw ApiError{400, "The model `" + *m + "` does not exist.", "model", "model_not_found"};
  TokenizeRequest out;
  out.return_token_strs = get_bool(body, "return_token_strs").value_or(false);
  const bool add_special = get_bool(body, "add_special_tokens").value_or(!chat);
  if (chat) {
    ParsedRequest parsed;
    parse_chat_prompt(body, ctx, parsed);
    out.tokens = encode_text(ctx, parsed.rendered_prompt, "messages", add_special);
  } else {
    const auto prompt = get_string(body, "prompt");
    if (!prompt) bad("prompt", "'prompt' (a string) or 'messages' is required", "missing_required_parameter");
    out.tokens = encode_text(ctx, *prompt, "prompt", add_special);
  }
  return out;
}

std::vector<int32_t> parse_detokenize_request(std::string_view body_text, const RequestContext& ctx) {
  const json body = parse_json_limited(body_text);
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  for (auto it = body.begin(); it != body.end(); ++it)
    if (it.key() != "model" && it.key() != "tokens")
      bad(it.key(), "unsupported field '" + it.key() + "' for /detokenize (see docs/api.md)", "unknown_parameter");
  if (auto m = get_string(body, "model"))
    if (std::find(ctx.model_names.begin(), ctx.model_names.end(), *m) == ctx.model_names.end())
      throw ApiError{400, "The model `" + *m + "` does not exist.", "model", "model_not_found"};
  if (!ctx.tokenizer) throw ApiError{400, "/detokenize needs a tokenizer (the server runs with --skip-tokenizer-init)", "", ""};
  const auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) bad("tokens", "'tokens' (an array of token ids) is required", "missing_required_parameter");
  std::vector<int32_t> ids;
  for (const auto& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= ctx.vocab_size)
      bad("tokens", "'tokens' holds " + t.dump() + ", not a token id in [0, " + std::to_string(ctx.vocab_size) + ")", "invalid_value");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

}  // namespace fathom::server
