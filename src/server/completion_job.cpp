#include "server/completion_job.h"

#include <algorithm>
#include <ctime>
#include <utility>

#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

namespace {
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// OpenAI's tool_calls list; streaming chunks number the calls.
json tool_calls_json(const std::vector<ToolCall>& calls, bool indexed) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id}, {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) call["index"] = i;
    out.push_back(call);
  }
  return out;
}
}  // namespace

CompletionJob::CompletionJob(const ParsedRequest& req, std::string id, std::string model, bool reasoning,
                             const tok::Tokenizer* tokenizer, std::optional<ToolCallFormat> tools,
                             ToolCallIdGenerator tool_ids)
    : tok_(tokenizer),
      chat_(req.chat),
      stream_(req.common.stream),
      include_usage_(req.common.include_usage),
      return_token_ids_(req.common.return_token_ids),
      reasoning_(reasoning && req.chat && req.reasoning.separate),
      include_reasoning_(req.reasoning.include),
      stream_reasoning_(req.reasoning.stream),
      logprobs_(req.common.params.logprobs),
      n_(req.common.n),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(int64_t(std::time(nullptr))),
      prompts_(req.prompts),
      echo_texts_(req.echo_texts),
      tools_(req.tools),
      tool_ids_(std::move(tool_ids)) {
  if (chat_) tool_choice_ = req.tool_choice, tool_choice_name_ = req.tool_choice_name;
  if (chat_ && tools && !req.tools.is_null() && tool_choice_ == ParsedRequest::ToolChoice::Auto) tool_format_ = tools;
  const bool starts_in_reasoning = reasoning_ && ReasoningParser::prompt_opens_reasoning(req.rendered_prompt);
  choices_.resize(prompts_.size() * size_t(n_));
  for (auto& c : choices_) {
    if (reasoning_) c.reasoning_parser = std::make_unique<ReasoningParser>(starts_in_reasoning);
    if (tool_format_ && stream_) c.tool_parser = std::make_unique<ToolCallStreamParser>(*tool_format_, tools_, tool_ids_);
  }
  for (const auto& p : prompts_) prompt_tokens_ += int64_t(p.size());
  remaining_ = int(choices_.size());
}

std::string CompletionJob::token_str(int32_t id) const {
  if (!tok_) return "token_id:" + std::to_string(id);
  return tok_->decode({uint32_t(id)}, false);
}

json CompletionJob::usage_json() const {
  int64_t comp = 0, cached = 0;
  for (const auto& c : choices_) comp += c.completion_tokens;
  // A prompt's tokens served by the prefix cache: the most any of its n choices found (choice
  // index = prompt * n + j).
  for (size_t p = 0; p < prompts_.size(); ++p) {
    int most = 0;
    for (int j = 0; j < n_; ++j) most = std::max(most, choices_[p * size_t(n_) + size_t(j)].cached_tokens);
    cached += most;
  }
  return json{{"prompt_tokens", prompt_tokens_},
              {"total_tokens", prompt_tokens_ + comp},
              {"completion_tokens", comp},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json CompletionJob::chunk_base() const {
  return json{{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_}, {"model", model_}};
}

json CompletionJob::logprobs_json(Choice& c, const std::vector<TokenLogprob>& lps) const {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  };
  if (chat_) {
    json content = json::array();
    for (const auto& lp : lps) {
      std::string t = token_str(lp.token);
      json top = json::array();
      for (auto [id, v] : lp.top) {
        std::string ts = token_str(id);
        top.push_back({{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
      }
      content.push_back({{"token", t}, {"logprob", lp.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), tlp = json::array(), top = json::array(), off = json::array();
  for (const auto& lp : lps) {
    std::string t = token_str(lp.token);
    tokens.push_back(t);
    tlp.push_back(lp.logprob);
    json m = json::object();
    for (auto [id, v] : lp.top) m[token_str(id)] = v;
    top.push_back(m);
    off.push_back(c.text_offset);
    c.text_offset += t.size();
  }
  return json{{"text_offset", off}, {"token_logprobs", tlp}, {"tokens", tokens}, {"top_logprobs", top}};
}

std::string CompletionJob::sse_start() {
  std::string out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    json choice;
    if (chat_) {
      choice = {{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    } else if (!echo_texts_.empty()) {
      const std::string& echo = echo_texts_[i / size_t(n_)];
      choices_[i].text_offset = echo.size();
      choice = {{"index", i}, {"text", echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    } else {
      continue;
    }
    json j = chunk_base();
    j["choices"] = json::array({choice});
    if (include_usage_) j["usage"] = nullptr;
    out += sse(j);
  }
  return out;
}

std::string CompletionJob::apply(RequestOutput& ev) {
  Choice& c = choices_.at(size_t(ev.index));
  std::string d_reason, d_content;
  c.text += ev.text;
  c.token_ids.insert(c.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
  c.completion_tokens = ev.completion_tokens;
  c.cached_tokens = ev.cached_tokens;
  if (!stream_) c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (c.reasoning_parser) {
    c.reasoning_parser->feed(ev.text, d_reason, d_content);
    if (ev.finished) c.reasoning_parser->finish(d_reason, d_content);
  } else {
    d_content = ev.text;
  }
  d_reason = reasoning_delta(c, std::move(d_reason), ev.finished);
  c.reasoning += d_reason;
  c.content += d_content;
  if (ev.finished) {
    c.finish_reason = ev.finish_reason;
    if (!ev.stop_str.empty()) c.stop_reason = ev.stop_str;
    else if (ev.stop_token) c.stop_reason = *ev.stop_token;
    if (ev.finish_reason == "error" && error_.empty()) error_ = ev.error.empty() ? "internal error" : ev.error;
    if (ev.finish_reason == "abort") aborted_ = true;
    --remaining_;
  }
  if (!stream_ || ev.finish_reason == "error") return "";
  const bool has_lp = logprobs_ >= 0 && !ev.logprobs.empty();
  json choice = {{"index", ev.index}};
  std::string finish = ev.finish_reason;
  if (chat_) {
    json delta = json::object();
    if (!d_reason.empty()) delta["reasoning_content"] = d_reason;
    if (c.tool_parser) {
      stream_tools(c, d_content, ev.finished, delta);
      if (ev.finished) finish = c.finish_reason = finish_reason_of(c, c.tool_parser->calls());
    } else if (forced_tool_choice()) {
      stream_forced(c, d_content, ev.finished, delta);
      if (ev.finished && tool_choice_ == ParsedRequest::ToolChoice::Required && !c.forced_id.empty())
        finish = c.finish_reason = finish_reason_of(c, 1);
    } else if (!d_content.empty()) {
      delta["content"] = d_content;
    }
    if (delta.empty() && !ev.finished && !has_lp && !return_token_ids_) return "";
    choice["delta"] = delta;
  } else {
    if (ev.text.empty() && !ev.finished && !has_lp && !return_token_ids_) return "";
    choice["text"] = ev.text;
  }
  choice["logprobs"] = has_lp ? logprobs_json(c, ev.logprobs) : json(nullptr);
  choice["finish_reason"] = ev.finished ? json(finish) : json(nullptr);
  if (ev.finished) choice["stop_reason"] = c.stop_reason;
  if (return_token_ids_) choice["token_ids"] = ev.token_ids;
  json j = chunk_base();
  j["choices"] = json::array({choice});
  if (include_usage_) j["usage"] = nullptr;
  return sse(j);
}

std::string CompletionJob::reasoning_delta(Choice& c, std::string d_reason, bool finished) const {
  if (!include_reasoning_) return "";
  if (stream_reasoning_ || !stream_) return d_reason;
  c.held_reasoning += d_reason;
  if (!finished && c.reasoning_parser && c.reasoning_parser->in_reasoning()) return "";
  return std::exchange(c.held_reasoning, std::string());
}

void CompletionJob::stream_tools(Choice& c, const std::string& d_content, bool finished, json& delta) {
  ToolCallStreamDelta td = c.tool_parser->feed(d_content);
  if (finished) {
    ToolCallStreamDelta tail = c.tool_parser->finish();
    td.content += tail.content;
    td.tool_calls.insert(td.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
  }
  if (!td.content.empty()) delta["content"] = td.content;
  if (td.tool_calls.empty()) return;
  json calls = json::array();
  for (const ToolCallDelta& d : td.tool_calls) {
    json call = {{"index", d.index}};
    json fn = json::object();
    if (!d.id.empty()) {  // a call's first delta: OpenAI sends id, type and name once
      call["id"] = d.id;
      call["type"] = "function";
      fn["name"] = d.name;
    }
    fn["arguments"] = d.arguments;
    call["function"] = fn;
    calls.push_back(call);
  }
  delta["tool_calls"] = calls;
}

bool CompletionJob::forced_calls(const std::string& text, std::vector<ToolCall>& calls, bool length_cut, bool* cut) {
  if (tool_choice_ == ParsedRequest::ToolChoice::Named) {  // the grammar's arguments object, as written
    calls.push_back({tool_ids_(), tool_choice_name_, text});
    return true;
  }
  const auto split = split_forced_calls(text, length_cut, cut);
  if (!split) return false;
  for (const ForcedCall& f : *split) calls.push_back({tool_ids_(), f.name, f.arguments});
  return true;
}

// Named: the arguments stream as they come. Required: the list is complete only at the end, so
// its calls go out in the last chunk.
void CompletionJob::stream_forced(Choice& c, const std::string& d_content, bool finished, json& delta) {
  json calls = json::array();
  if (tool_choice_ == ParsedRequest::ToolChoice::Named) {
    if (d_content.empty()) return;
    json call = {{"index", 0}};
    json fn = json::object();
    if (c.forced_id.empty()) {
      c.forced_id = tool_ids_();
      call["id"] = c.forced_id;
      call["type"] = "function";
      fn["name"] = tool_choice_name_;
    }
    fn["arguments"] = d_content;
    call["function"] = fn;
    calls.push_back(call);
  } else {
    if (!finished) return;
    std::vector<ToolCall> parsed;
    bool cut = false;
    if (!forced_calls(c.content, parsed, c.finish_reason == "length", &cut)) {
      if (!c.content.empty()) delta["content"] = c.content;
      return;
    }
    if (parsed.empty()) return;  // cut inside the first call: nothing to send
    calls = tool_calls_json(parsed, /*indexed=*/true);
    c.forced_id = cut ? "" : parsed.front().id;  // cut: finish_reason stays "length"
  }
  delta["tool_calls"] = calls;
}

std::string CompletionJob::finish_reason_of(const Choice& c, int calls) {
  return calls > 0 && (c.finish_reason == "stop" || c.finish_reason == "length") ? "tool_calls" : c.finish_reason;
}

std::string CompletionJob::sse_end() {
  std::string out;
  if (!error_.empty()) {
    out += sse(error_json(ApiError{500, error_, "", "internal_error"}));
  } else if (include_usage_) {
    json j = chunk_base();
    j["choices"] = json::array();
    j["usage"] = usage_json();
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

json CompletionJob::response() {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    json lp = logprobs_ >= 0 ? logprobs_json(c, c.logprobs) : json(nullptr);
    json ch;
    if (chat_) {
      json msg = {{"role", "assistant"}};
      std::string finish = c.finish_reason;
      std::vector<ToolCall> forced;
      bool cut = false;
      if (forced_tool_choice() && forced_calls(c.content, forced, c.finish_reason == "length", &cut)) {
        msg["content"] = nullptr;
        msg["tool_calls"] = tool_calls_json(forced, /*indexed=*/false);
        // OpenAI ends a forced named call with "stop"; "required" as a model's own calls; a
        // list cut by max_tokens keeps "length" (its complete calls only).
        if (tool_choice_ == ParsedRequest::ToolChoice::Required && !cut) finish = finish_reason_of(c, int(forced.size()));
      } else if (tool_format_) {
        // The whole output at once: a broken block stays content (a stream cannot take back a
        // call it has begun; a whole parse can).
        ToolCallParse parsed = parse_tool_calls(c.content, *tool_format_, tools_, tool_ids_);
        msg["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
        msg["tool_calls"] = tool_calls_json(parsed.calls, /*indexed=*/false);
        finish = finish_reason_of(c, int(parsed.calls.size()));
      } else {
        msg["content"] = (c.content.empty() && c.reasoning_parser) ? json(nullptr) : json(c.content);
      }
      if (reasoning_ && include_reasoning_) msg["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      ch = {{"index", i}, {"message", msg}, {"logprobs", lp}, {"finish_reason", finish}, {"stop_reason", c.stop_reason}};
    } else {
      const std::string text = echo_texts_.empty() ? c.text : echo_texts_[i / size_t(n_)] + c.text;
      ch = {{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}, {"stop_reason", c.stop_reason}};
    }
    if (return_token_ids_) {
      ch["token_ids"] = c.token_ids;
      ch["prompt_token_ids"] = prompts_[i / size_t(n_)];
    }
    choices.push_back(ch);
  }
  return json{{"id", id_},
              {"object", chat_ ? "chat.completion" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", choices},
              {"usage", usage_json()}};
}

}  // namespace fathom::server
