#include "server/completion_job.h"

#include <ctime>

#include "tokenizer/tokenizer.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

namespace {
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }
}  // namespace

CompletionJob::CompletionJob(const ParsedRequest& req, std::string id, std::string model, bool reasoning,
                             const tok::Tokenizer* tokenizer)
    : tok_(tokenizer),
      chat_(req.chat),
      stream_(req.common.stream),
      include_usage_(req.common.include_usage),
      return_token_ids_(req.common.return_token_ids),
      reasoning_(reasoning && req.chat),
      logprobs_(req.common.params.logprobs),
      n_(req.common.n),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(int64_t(std::time(nullptr))),
      prompts_(req.prompts),
      echo_texts_(req.echo_texts) {
  const bool starts_in_reasoning = reasoning_ && ReasoningParser::prompt_opens_reasoning(req.rendered_prompt);
  choices_.resize(prompts_.size() * size_t(n_));
  for (auto& c : choices_)
    if (reasoning_) c.reasoning_parser = std::make_unique<ReasoningParser>(starts_in_reasoning);
  for (const auto& p : prompts_) prompt_tokens_ += int64_t(p.size());
  remaining_ = int(choices_.size());
}

std::string CompletionJob::token_str(int32_t id) const {
  if (!tok_) return "token_id:" + std::to_string(id);
  return tok_->decode({uint32_t(id)}, false);
}

json CompletionJob::usage_json() const {
  int64_t comp = 0;
  for (const auto& c : choices_) comp += c.completion_tokens;
  return json{{"prompt_tokens", prompt_tokens_}, {"total_tokens", prompt_tokens_ + comp}, {"completion_tokens", comp}};
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
  if (!stream_) c.logprobs.insert(c.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
  if (c.reasoning_parser) {
    c.reasoning_parser->feed(ev.text, d_reason, d_content);
    if (ev.finished) c.reasoning_parser->finish(d_reason, d_content);
  } else {
    d_content = ev.text;
  }
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
  if (chat_) {
    json delta = json::object();
    if (!d_reason.empty()) delta["reasoning_content"] = d_reason;
    if (!d_content.empty()) delta["content"] = d_content;
    if (delta.empty() && !ev.finished && !has_lp && !return_token_ids_) return "";
    choice["delta"] = delta;
  } else {
    if (ev.text.empty() && !ev.finished && !has_lp && !return_token_ids_) return "";
    choice["text"] = ev.text;
  }
  choice["logprobs"] = has_lp ? logprobs_json(c, ev.logprobs) : json(nullptr);
  choice["finish_reason"] = ev.finished ? json(ev.finish_reason) : json(nullptr);
  if (ev.finished) choice["stop_reason"] = c.stop_reason;
  if (return_token_ids_) choice["token_ids"] = ev.token_ids;
  json j = chunk_base();
  j["choices"] = json::array({choice});
  if (include_usage_) j["usage"] = nullptr;
  return sse(j);
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
      msg["content"] = (c.content.empty() && c.reasoning_parser) ? json(nullptr) : json(c.content);
      if (reasoning_) msg["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      ch = {{"index", i}, {"message", msg}, {"logprobs", lp}, {"finish_reason", c.finish_reason}, {"stop_reason", c.stop_reason}};
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
