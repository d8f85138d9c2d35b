#include "server/openai_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "chat/chat_template.h"
#include "core/error.h"
#include "model/model_runner.h"
#include "runtime/engine.h"
#include "server/protocol.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;
using httplib::DataSink;

std::atomic<bool> g_signal{false};
extern "C" void on_signal(int) { g_signal = true; }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 gen{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)gen(), (unsigned long long)(gen() & 0xffffffffu));
  return std::string(prefix) + buf;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

// Raises the listen backlog of the socket bound to `port` (cpp-httplib hard-codes 5): Linux
// lets listen() be called again on a listening socket to change it.
void raise_backlog(int port, int backlog) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int fd = std::atoi(e->d_name);
    if (fd <= 2) continue;
    int acc = 0;
    socklen_t len = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || !acc) continue;
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
    int p = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
                                    : ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    if (p == port) ::listen(fd, backlog);
  }
  closedir(d);
}

struct ChoiceState {
  std::string text;  // completions text / chat raw text
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  std::string reasoning, content;
  std::unique_ptr<ReasoningParser> rp;
  std::string finish_reason;
  json stop_reason = nullptr;
  bool finished = false;
  int completion_tokens = 0;
  size_t text_offset = 0;
};

// One client request (n choices per prompt), shared by the handler and the stream provider.
struct Job {
  bool chat = false, stream = false, include_usage = false, return_token_ids = false, reasoning = false;
  int logprobs = -1;
  int n = 1;
  std::string id, model;
  int64_t created = 0;
  uint64_t group = 0;
  std::shared_ptr<OutputChannel> chan = std::make_shared<OutputChannel>();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<ChoiceState> choices;
  int remaining = 0;
  int64_t prompt_tokens = 0;
  bool done = false, started = false;
  Clock::time_point last_write = Clock::now();
};

class OpenAIServer {
 public:
  explicit OpenAIServer(const ServerConfig& cfg) : cfg_(cfg) {}
  int run();

 private:
  void setup_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  std::shared_ptr<Job> build_job(const json& body, bool chat);
  std::string token_str(int32_t id) const {
    if (!tok_) return "token_id:" + std::to_string(id);
    return tok_->decode({uint32_t(id)}, false);
  }
  json logprobs_json(Job& job, ChoiceState& c, const std::vector<TokenLogprob>& lps);
  void apply_event(Job& job, RequestOutput& ev, std::string& d_text, std::string& d_reason, std::string& d_content);
  json final_response(Job& job);
  json usage_json(const Job& job) const;

  ServerConfig cfg_;
  std::string name_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<chat::ChatTemplate> tmpl_;
  json special_tokens_ = json::object();
  std::string template_error_;
  std::unique_ptr<Engine> engine_;
  httplib::Server http_;
  std::atomic<bool> stopping_{false};
  int64_t vocab_ = 0, max_len_ = 0;
};

json OpenAIServer::usage_json(const Job& job) const {
  int64_t comp = 0;
  for (const auto& c : job.choices) comp += c.completion_tokens;
  return json{{"prompt_tokens", job.prompt_tokens}, {"total_tokens", job.prompt_tokens + comp}, {"completion_tokens", comp}};
}

json OpenAIServer::logprobs_json(Job& job, ChoiceState& c, const std::vector<TokenLogprob>& lps) {
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(int(ch));
    return b;
  };
  if (job.chat) {
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

void OpenAIServer::apply_event(Job& job, RequestOutput& ev, std::string& d_text, std::string& d_reason,
                               std::string& d_content) {
  ChoiceState& c = job.choices.at(size_t(ev.index));
  d_text = ev.text;
  c.text += ev.text;
  c.token_ids.insert(c.token_ids.end(), ev.token_ids.begin(), ev.token_ids.end());
  c.completion_tokens = ev.completion_tokens;
  if (c.rp) {
    c.rp->feed(ev.text, d_reason, d_content);
    if (ev.finished) c.rp->finish(d_reason, d_content);
  } else {
    d_content = ev.text;
  }
  c.reasoning += d_reason;
  c.content += d_content;
  if (ev.finished) {
    c.finished = true;
    c.finish_reason = ev.finish_reason;
    if (!ev.stop_str.empty()) c.stop_reason = ev.stop_str;
    else if (ev.stop_token) c.stop_reason = *ev.stop_token;
    --job.remaining;
  }
}

json OpenAIServer::final_response(Job& job) {
  json choices = json::array();
  for (size_t i = 0; i < job.choices.size(); ++i) {
    ChoiceState& c = job.choices[i];
    json lp = nullptr;
    if (job.logprobs >= 0) lp = logprobs_json(job, c, c.logprobs);
    json ch;
    if (job.chat) {
      json msg = {{"role", "assistant"}};
      msg["content"] = (c.content.empty() && c.rp) ? json(nullptr) : json(c.content);
      if (job.reasoning) msg["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
      ch = {{"index", i}, {"message", msg}, {"logprobs", lp}, {"finish_reason", c.finish_reason}, {"stop_reason", c.stop_reason}};
    } else {
      ch = {{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}, {"stop_reason", c.stop_reason}};
    }
    if (job.return_token_ids) {
      ch["token_ids"] = c.token_ids;
      ch["prompt_token_ids"] = job.prompts[i / size_t(job.n)];
    }
    choices.push_back(ch);
  }
  return json{{"id", job.id},
              {"object", job.chat ? "chat.completion" : "text_completion"},
              {"created", job.created},
              {"model", job.model},
              {"choices", choices},
              {"usage", usage_json(job)}};
}

std::shared_ptr<Job> OpenAIServer::build_job(const json& body, bool chat) {
  if (!body.is_object()) throw ApiError{400, "request body must be a JSON object", "", "invalid_type"};
  auto job = std::make_shared<Job>();
  job->chat = chat;
  if (auto m = get_string(body, "model"); m && *m != name_ && *m != cfg_.model)
    throw ApiError{400, "The model `" + *m + "` does not exist.", "model", "model_not_found"};
  CommonParams cp = parse_common(body, chat, vocab_, tok_ != nullptr);
  std::string prompt_text;
  if (chat) {
    if (!tok_) throw ApiError{400, "chat completions need a tokenizer (server runs with --skip-tokenizer-init)", "messages", ""};
    if (!tmpl_) throw ApiError{400, "the model has no chat template: " + template_error_, "messages", ""};
    auto it = body.find("messages");
    if (it == body.end() || it->is_null()) throw ApiError{400, "'messages' is required", "messages", "missing_required_parameter"};
    if (!it->is_array()) throw ApiError{400, "'messages' must be a list", "messages", "invalid_type"};
    if (it->empty()) throw ApiError{400, "'messages' must not be empty", "messages", "invalid_value"};
    json msgs = json::array();
    for (const auto& m : *it) {
      if (!m.is_object()) throw ApiError{400, "each message must be an object", "messages", "invalid_type"};
      auto role = m.find("role");
      if (role == m.end() || !role->is_string())
        throw ApiError{400, "each message needs a string 'role'", "messages", "invalid_value"};
      static const std::set<std::string> roles = {"system", "user", "assistant", "tool", "developer"};
      if (!roles.count(role->get<std::string>()))
        throw ApiError{400, "unknown message role '" + role->get<std::string>() + "'", "messages", "invalid_value"};
      json out = m;
      auto content = m.find("content");
      if (content != m.end() && content->is_array()) {
        std::string joined;
        for (const auto& part : *content) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
            throw ApiError{400, "only text content parts are supported", "messages", "invalid_value"};
          if (!joined.empty()) joined += "\n";
          joined += part["text"].get<std::string>();
        }
        out["content"] = joined;
      } else if (content != m.end() && !content->is_string() && !content->is_null()) {
        throw ApiError{400, "message 'content' must be a string, a list of parts or null", "messages", "invalid_type"};
      }
      msgs.push_back(out);
    }
    json tools = nullptr;
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
      if (!t->is_array()) throw ApiError{400, "'tools' must be a list", "tools", "invalid_type"};
      if (!t->empty()) tools = *t;
    }
    json kwargs = json::object();
    if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
      if (!k->is_object()) throw ApiError{400, "'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type"};
      kwargs = *k;
    }
    bool add_gen = get_bool(body, "add_generation_prompt").value_or(true);
    try {
      prompt_text = tmpl_->render(msgs, tools, add_gen, kwargs, special_tokens_);
    } catch (const std::exception& e) {
      throw ApiError{400, std::string("chat template error: ") + e.what(), "messages", ""};
    }
    std::vector<uint32_t> ids = tok_->encode(prompt_text, false);
    job->prompts.emplace_back(ids.begin(), ids.end());
    job->reasoning = cfg_.reasoning_parser == "qwen3";
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) throw ApiError{400, "'prompt' is required", "prompt", "missing_required_parameter"};
    auto encode = [&](const std::string& s) {
      if (!tok_) throw ApiError{400, "text prompts need a tokenizer (server runs with --skip-tokenizer-init): send token ids", "prompt", ""};
      std::vector<uint32_t> ids;
      try {
        ids = tok_->encode(s, true);
      } catch (const std::exception& e) {
        throw ApiError{400, std::string("cannot tokenize prompt: ") + e.what(), "prompt", ""};
      }
      return std::vector<int32_t>(ids.begin(), ids.end());
    };
    auto ids_of = [&](const json& arr) {
      std::vector<int32_t> v;
      for (const auto& e : arr) {
        if (!e.is_number_integer()) throw ApiError{400, "token id prompts must hold integers", "prompt", "invalid_type"};
        int64_t t = e.get<int64_t>();
        if (t < 0 || t >= vocab_)
          throw ApiError{400, "token id " + std::to_string(t) + " is out of range [0, " + std::to_string(vocab_) + ")", "prompt", "invalid_value"};
        v.push_back(int32_t(t));
      }
      return v;
    };
    if (it->is_string()) {
      job->prompts.push_back(encode(it->get<std::string>()));
    } else if (it->is_array()) {
      if (it->empty()) throw ApiError{400, "'prompt' must not be empty", "prompt", "invalid_value"};
      const json& first = (*it)[0];
      if (first.is_string()) {
        for (const auto& e : *it) {
          if (!e.is_string()) throw ApiError{400, "'prompt' mixes strings and other values", "prompt", "invalid_type"};
          job->prompts.push_back(encode(e.get<std::string>()));
        }
      } else if (first.is_number()) {
        job->prompts.push_back(ids_of(*it));
      } else if (first.is_array()) {
        for (const auto& e : *it) {
          if (!e.is_array()) throw ApiError{400, "'prompt' mixes token lists and other values", "prompt", "invalid_type"};
          job->prompts.push_back(ids_of(e));
        }
      } else {
        throw ApiError{400, "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists", "prompt", "invalid_type"};
      }
    } else {
      throw ApiError{400, "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists", "prompt", "invalid_type"};
    }
    if (job->prompts.size() * size_t(cp.n) > 256) throw ApiError{400, "too many prompts x n (at most 256)", "prompt", "invalid_value"};
  }
  // Lengths.
  int64_t max_tokens_all = std::numeric_limits<int32_t>::max();
  for (const auto& p : job->prompts) {
    const int64_t len = int64_t(p.size());
    if (len == 0) throw ApiError{400, "the prompt is empty", chat ? "messages" : "prompt", "invalid_value"};
    if (len > max_len_)
      throw ApiError{413, "This model's maximum context length is " + std::to_string(max_len_) + " tokens. However, your prompt has " +
                              std::to_string(len) + " tokens.", chat ? "messages" : "prompt", "context_length_exceeded"};
    const int64_t room = max_len_ - len;
    if (cp.max_tokens) {
      if (*cp.max_tokens > room)
        throw ApiError{400, "This model's maximum context length is " + std::to_string(max_len_) + " tokens. However, you requested " +
                                std::to_string(len + *cp.max_tokens) + " tokens (" + std::to_string(len) + " in the prompt, " +
                                std::to_string(*cp.max_tokens) + " in the completion).", chat ? "max_completion_tokens" : "max_tokens",
                       "context_length_exceeded"};
      max_tokens_all = std::min(max_tokens_all, *cp.max_tokens);
    } else {
      if (room <= 0)
        throw ApiError{400, "the prompt leaves no room for a completion within max-model-len " + std::to_string(max_len_), "prompt", "context_length_exceeded"};
      max_tokens_all = std::min(max_tokens_all, chat ? room : std::min<int64_t>(16, room));
    }
  }
  cp.params.max_tokens = int(max_tokens_all);
  if (cp.params.min_tokens > cp.params.max_tokens) cp.params.min_tokens = cp.params.max_tokens;
  cp.params.detokenize = tok_ != nullptr;

  job->stream = cp.stream;
  job->include_usage = cp.include_usage;
  job->return_token_ids = cp.return_token_ids;
  job->logprobs = cp.params.logprobs;
  job->n = cp.n;
  job->id = random_id(chat ? "chatcmpl-" : "cmpl-");
  job->model = name_;
  job->created = int64_t(std::time(nullptr));
  const bool starts_in_reasoning = job->reasoning && ReasoningParser::prompt_opens_reasoning(prompt_text);
  job->choices.resize(job->prompts.size() * size_t(cp.n));
  for (auto& c : job->choices)
    if (job->reasoning) c.rp = std::make_unique<ReasoningParser>(starts_in_reasoning);
  for (const auto& p : job->prompts) job->prompt_tokens += int64_t(p.size());
  job->remaining = int(job->choices.size());
  job->group = engine_->new_group_id();
  // Build the engine requests.
  std::vector<RequestSpec> specs;
  for (size_t pi = 0; pi < job->prompts.size(); ++pi)
    for (int i = 0; i < cp.n; ++i) {
      RequestSpec s;
      s.group = job->group;
      s.index = int(pi) * cp.n + i;
      s.prompt = job->prompts[pi];
      s.params = cp.params;
      s.params.sampling.seed = cp.params.sampling.seed + uint64_t(s.index);
      s.out = job->chan;
      specs.push_back(std::move(s));
    }
  if (stopping_) throw ApiError{503, "the server is shutting down", "", "service_unavailable"};
  switch (engine_->submit(std::move(specs))) {
    case Engine::SubmitResult::Ok: break;
    case Engine::SubmitResult::QueueFull:
      throw ApiError{429, "the request queue is full (--max-queue-len " + std::to_string(cfg_.max_queue_len) + "); retry later", "", "queue_full"};
    case Engine::SubmitResult::ShuttingDown: throw ApiError{503, "the server is shutting down", "", "service_unavailable"};
  }
  return job;
}

void OpenAIServer::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  std::shared_ptr<Job> job;
  try {
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded()) throw ApiError{400, "the request body is not valid JSON", "", "invalid_json"};
    job = build_job(body, chat);
  } catch (const ApiError& e) {
    return send_error(res, e);
  } catch (const std::exception& e) {
    return send_error(res, ApiError{400, e.what(), "", ""});
  }
  if (!job->stream) {
    while (job->remaining > 0) {
      auto ev = job->chan->pop(std::chrono::milliseconds(200));
      if (!ev) continue;
      std::string a, b, c;
      ChoiceState& ch = job->choices.at(size_t(ev->index));
      ch.logprobs.insert(ch.logprobs.end(), ev->logprobs.begin(), ev->logprobs.end());
      apply_event(*job, *ev, a, b, c);
    }
    for (const auto& c : job->choices)
      if (c.finish_reason == "abort" && stopping_) return send_error(res, ApiError{503, "the server is shutting down", "", ""});
    res.set_content(dump(final_response(*job)), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  Engine* engine = engine_.get();
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job](size_t, DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          job->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        auto chunk_base = [&]() {
          json j = {{"id", job->id}, {"object", job->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", job->created}, {"model", job->model}};
          return j;
        };
        if (!job->started) {
          job->started = true;
          if (job->chat) {
            for (size_t i = 0; i < job->choices.size(); ++i) {
              json j = chunk_base();
              j["choices"] = json::array({json{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                               {"logprobs", nullptr}, {"finish_reason", nullptr}}});
              if (job->include_usage) j["usage"] = nullptr;
              if (!write("data: " + dump(j) + "\n\n")) return false;
            }
          }
        }
        if (job->remaining == 0) {
          if (job->include_usage) {
            json j = chunk_base();
            j["choices"] = json::array();
            j["usage"] = usage_json(*job);
            if (!write("data: " + dump(j) + "\n\n")) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          job->done = true;
          sink.done();
          return true;
        }
        auto ev = job->chan->pop(std::chrono::milliseconds(250));
        if (!ev) {
          // Idle (queued): an SSE comment keeps proxies happy and detects a gone client.
          if (Clock::now() - job->last_write > std::chrono::seconds(1)) return write(": ping\n\n");
          return true;
        }
        std::string d_text, d_reason, d_content;
        apply_event(*job, *ev, d_text, d_reason, d_content);
        ChoiceState& c = job->choices.at(size_t(ev->index));
        const bool has_lp = job->logprobs >= 0 && !ev->logprobs.empty();
        json choice = {{"index", ev->index}};
        if (job->chat) {
          json delta = json::object();
          if (!d_reason.empty()) delta["reasoning_content"] = d_reason;
          if (!d_content.empty()) delta["content"] = d_content;
          if (delta.empty() && !ev->finished && !has_lp && !job->return_token_ids) return true;
          choice["delta"] = delta;
        } else {
          if (d_text.empty() && !ev->finished && !has_lp && !job->return_token_ids) return true;
          choice["text"] = d_text;
        }
        choice["logprobs"] = has_lp ? logprobs_json(*job, c, ev->logprobs) : json(nullptr);
        choice["finish_reason"] = ev->finished ? json(ev->finish_reason) : json(nullptr);
        if (ev->finished) choice["stop_reason"] = c.stop_reason;
        if (job->return_token_ids) choice["token_ids"] = ev->token_ids;
        json j = chunk_base();
        j["choices"] = json::array({choice});
        if (job->include_usage) j["usage"] = nullptr;
        return write("data: " + dump(j) + "\n\n");
      },
      [job, engine](bool) {
        if (job->remaining > 0) engine->abort(job->group);  // client went away
      });
}

void OpenAIServer::setup_routes() {
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!cfg_.api_key.empty() && req.path.rfind("/v1", 0) == 0) {
      if (req.get_header_value("Authorization") != "Bearer " + cfg_.api_key) {
        send_error(res, ApiError{401, "Invalid or missing API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status < 400) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg;
    switch (res.status) {
      case 404: msg = "Not found: " + req.method + " " + req.path; break;
      case 413: msg = "Request body too large"; break;
      case 405: msg = "Method not allowed"; break;
      default: msg = "Bad request"; break;
    }
    send_error(res, ApiError{res.status, msg, "", res.status == 404 ? "not_found" : ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError{500, msg, "", ""});
  });
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_ || !engine_->accepting()) return send_error(res, ApiError{503, "shutting down", "", ""});
    res.set_content("", "text/plain");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(engine_->render_metrics("fathom:", name_), "text/plain; version=0.0.4");
  });
  auto models = [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", name_}, {"object", "model"}, {"created", int64_t(std::time(nullptr))}, {"owned_by", "fathom"},
              {"root", cfg_.model}, {"parent", nullptr}, {"max_model_len", max_len_}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  };
  http_.Get("/v1/models", models);
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, false); });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle_generate(req, res, true); });
}

int OpenAIServer::run() {
  name_ = cfg_.served_model_name.empty() ? cfg_.model : cfg_.served_model_name;
  if (!cfg_.reasoning_parser.empty() && cfg_.reasoning_parser != "qwen3")
    fail("--reasoning-parser: only 'qwen3' is supported, got '", cfg_.reasoning_parser, "'");
  if (!cfg_.skip_tokenizer_init) {
    tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_dir(cfg_.model));
    try {
      chat::ChatTemplateSource src = chat::load_chat_template(cfg_.model);
      tmpl_ = std::make_unique<chat::ChatTemplate>(src.source);
      special_tokens_ = src.special_tokens;
    } catch (const std::exception& e) {
      template_error_ = e.what();
      std::fprintf(stderr, "fathom serve: no chat template (%s); /v1/chat/completions disabled\n", e.what());
    }
  }
  EngineOptions eo;
  eo.load_format = cfg_.load_format;
  eo.num_layers = cfg_.num_layers;
  eo.max_seqs = cfg_.max_num_seqs;
  eo.max_model_len = cfg_.max_model_len;
  eo.max_batched_tokens = int(cfg_.max_num_batched_tokens);
  SpecOptions spec;
  spec.algorithm = parse_spec_algorithm(cfg_.speculative_algorithm);
  spec.num_steps = cfg_.speculative_num_steps;
  spec.ngram_min = cfg_.speculative_ngram_min;
  spec.ngram_max = cfg_.speculative_ngram_max;
  spec.adaptive = cfg_.speculative_adaptive;
  spec.disable_by_batch_size = cfg_.speculative_disable_by_batch_size;
  FATHOM_CHECK(spec.disable_by_batch_size >= 0, "--speculative-disable-by-batch-size must be >= 0");
  FATHOM_CHECK(spec.algorithm == SpecAlgorithm::None || (spec.num_steps >= 1 && spec.num_steps <= 4),
               "--speculative-num-steps must be 1..4 (got ", spec.num_steps, ")");
  if (spec.algorithm != SpecAlgorithm::None) eo.speculative_tokens = spec.num_steps;
  auto runner = open_model(cfg_.model, cfg_.device, /*with_mtp=*/spec.algorithm == SpecAlgorithm::Mtp, eo);
  const ModelConfig& mc = runner->config();
  vocab_ = mc.vocab_size;
  max_len_ = cfg_.max_model_len > 0 ? cfg_.max_model_len : (mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 4096);
  EngineConfig ec;
  ec.max_num_seqs = cfg_.max_num_seqs;
  ec.max_num_batched_tokens = cfg_.max_num_batched_tokens;
  ec.max_model_len = max_len_;
  ec.max_queue_len = cfg_.max_queue_len;
  ec.num_kv_blocks = cfg_.num_kv_blocks;
  ec.eos_token_ids.assign(mc.eos_token_ids.begin(), mc.eos_token_ids.end());
  ec.spec = spec;
  if (tok_ && special_tokens_.contains("eos_token") && special_tokens_["eos_token"].is_string())
    if (auto id = tok_->token_to_id(special_tokens_["eos_token"].get<std::string>())) ec.eos_token_ids.push_back(int32_t(*id));
  FATHOM_CHECK(cfg_.max_num_seqs > 0, "--max-num-seqs must be positive");
  FATHOM_CHECK(cfg_.max_queue_len >= 0, "--max-queue-len must be >= 0");
  engine_ = std::make_unique<Engine>(std::move(runner), tok_.get(), ec);

  const int threads = cfg_.http_threads > 0 ? cfg_.http_threads : cfg_.max_num_seqs + cfg_.max_queue_len + 64;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_.set_payload_max_length(size_t(64) << 20);
  http_.set_keep_alive_max_count(1000);
  http_.set_keep_alive_timeout(30);
  http_.set_read_timeout(60);
  http_.set_write_timeout(60);
  http_.set_tcp_nodelay(true);
  if (cfg_.log_requests)
    http_.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      std::fprintf(stderr, "%s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
    });
  setup_routes();
  if (!http_.bind_to_port(cfg_.host, cfg_.port)) fail("cannot listen on ", cfg_.host, ":", cfg_.port);
  raise_backlog(cfg_.port, cfg_.listen_backlog);

  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  engine_->start();
  std::thread watcher([this] {
    while (!g_signal && !stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stopping_ = true;
    engine_->shutdown();  // in-flight requests end with finish_reason "abort"
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    http_.stop();
  });
  std::fprintf(stderr, "fathom serve: %s on %s, listening on http://%s:%d (max-model-len %lld, max-num-seqs %d, max-num-batched-tokens %lld, %d HTTP threads)\n",
               name_.c_str(), engine_->device_name().c_str(), cfg_.host.c_str(), cfg_.port, (long long)max_len_,
               cfg_.max_num_seqs, (long long)cfg_.max_num_batched_tokens, threads);
  std::fflush(stderr);
  http_.listen_after_bind();
  stopping_ = true;
  watcher.join();
  engine_->shutdown();
  return 0;
}

}  // namespace

int run_server(const ServerConfig& cfg) {
  OpenAIServer s(cfg);
  return s.run();
}

}  // namespace fathom::server
