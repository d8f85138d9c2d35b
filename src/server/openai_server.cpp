#include "server/openai_server.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "chat/chat_template.h"
#include "core/error.h"
#include "grammar/compiler.h"
#include "model/model_runner.h"
#include "model/row_sampling_runner.h"
#include "runtime/engine.h"
#include "server/anthropic_messages.h"
#include "server/anthropic_stream.h"
#include "server/api_key.h"
#include "server/completion_job.h"
#include "server/http_server.h"
#include "server/openai_responses.h"
#include "server/protocol.h"
#include "server/request_parser.h"
#include "server/responses_stream.h"
#include "server/server_info.h"
#include "server/version.h"
#include "tokenizer/tokenizer.h"

namespace fathom::server {
namespace {

using json = nlohmann::ordered_json;

// SIGTERM / SIGINT seen: the first starts the drain, a second ends it at once.
std::atomic<int> g_signals{0};
extern "C" void on_signal(int) { g_signals.fetch_add(1); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string random_id(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard<std::mutex> l(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)gen(), (unsigned long long)(gen() & 0xffffffffu));
  return std::string(prefix) + buf;
}

// `anthropic`: Anthropic's error shape (/v1/messages), else OpenAI's.
HttpResponse error_response(const ApiError& e, bool anthropic = false) {
  HttpResponse r{e.status, "application/json", dump(anthropic ? anthropic_error_json(e) : error_json(e)), {}};
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// A request in flight: the job (response assembly) and where its events go. All of it is
// touched on the connection's strand only, after submission.
struct Flight {
  std::unique_ptr<CompletionJob> job;
  std::shared_ptr<OutputChannel> chan = std::make_shared<OutputChannel>();
  std::shared_ptr<HttpExchange> ex;
  uint64_t group = 0;
  bool started = false, done = false;
  std::atomic<int>* in_flight = nullptr;  // counted from submission to its response (the drain waits for it)
  // /v1/messages: answered in Anthropic's shapes (its message id; its events when streaming).
  bool anthropic = false;
  std::string message_id;
  std::unique_ptr<AnthropicStream> events;
  // /v1/responses: answered as a Response (its events when streaming); kept for
  // previous_response_id when `store`.
  bool responses = false, store = false;
  int64_t created_at = 0;
  nlohmann::ordered_json echo, conversation;  // ResponsesRequest's
  std::unique_ptr<ResponsesStream> response_events;

  void finish() {
    done = true;
    if (in_flight) in_flight->fetch_sub(1);
    in_flight = nullptr;
  }
  ~Flight() {
    if (in_flight) in_flight->fetch_sub(1);
  }
  HttpHeaders headers;  // with the response (the structured-output warning)
};

class OpenAIServer {
 public:
  explicit OpenAIServer(const ServeOptions& options) : opts_(options) {}
  int run();

 private:
  void load();
  // load()'s parts, in their order: --reasoning-parser and --tool-call-parser; the tokenizer and
  // chat template; the KV cache's size on stderr; the grammar compiler of structured output.
  void load_output_parsers();
  void load_tokenizer();
  void report_capacity(const ModelRunner& runner, int64_t max_model_len) const;
  // The tokens that end a sequence: the model's, and the tokenizer's eos token.
  std::vector<int32_t> end_token_ids(const ModelConfig& mc) const;
  void load_grammars(const std::vector<int32_t>& end_token_ids, int64_t vocab_size);
  void describe(int64_t max_model_len, int64_t kv_tokens);  // what /get_server_info tells
  void announce() const;  // the line on stderr once the server listens
  void setup_routes();
  void setup_info_routes();  // /v1/models and SGLang's /get_model_info, /get_server_info
  // SIGTERM: /health and new requests answer 503 while the requests in flight finish, for at
  // most --shutdown-timeout seconds (or until a second signal); then the rest are aborted.
  void drain_then_stop();
  void handle_generate(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex, bool chat);
  void handle_messages(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);  // Anthropic's
  void handle_count_tokens(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);
  void handle_responses(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);  // OpenAI's Responses
  // The Response object of a finished non-streamed flight (and the conversation stored).
  nlohmann::ordered_json finish_response(Flight& f);
  // Runs `parse` (which makes the flight's job), submits the request and starts draining it;
  // an error answers at once in the flight's protocol.
  void launch(const std::shared_ptr<Flight>& f, const std::function<ParsedRequest()>& parse);
  void handle_tokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);
  void handle_detokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex);
  nlohmann::ordered_json model_card() const;  // one /v1/models entry
  void submit(const ParsedRequest& pr, const std::shared_ptr<Flight>& f);
  // Moves the flight's pending engine events to the client (on the strand).
  void drain(Flight& f);

  ServeOptions opts_;
  std::string name_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<chat::ChatTemplate> tmpl_;
  RequestContext ctx_;
  std::optional<ToolCallFormat> tool_format_;  // --tool-call-parser
  std::unique_ptr<grammar::GrammarCompiler> grammars_;  // structured output (with a tokenizer)
  std::unique_ptr<ResponseStore> responses_;           // /v1/responses' previous_response_id
  std::atomic<int> in_flight_{0};  // before http_: its exchanges' flights count down in it
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> stopping_{false};
  ServerDescription description_;
};

void OpenAIServer::submit(const ParsedRequest& pr, const std::shared_ptr<Flight>& f) {
  std::vector<RequestSpec> specs;
  const int n = pr.common.n;
  for (size_t pi = 0; pi < pr.prompts.size(); ++pi)
    for (int i = 0; i < n; ++i) {
      RequestSpec s;
      s.group = f->group;
      s.index = int(pi) * n + i;
      s.prompt = pr.prompts[pi];
      s.params = pr.common.params;
      s.params.sampling.seed = pr.common.params.sampling.seed + uint64_t(s.index);
      s.out = f->chan;
      specs.push_back(std::move(s));
    }
  if (stopping_) throw ApiError{503, "the server is shutting down", "", "service_unavailable"};
  switch (engine_->submit(std::move(specs))) {
    case Engine::SubmitResult::Ok: return;
    case Engine::SubmitResult::QueueFull:
      throw ApiError{429, "the request queue is full (--max-queue-len " + std::to_string(opts_.engine.max_queue_len) + "); retry later", "",
                     "queue_full"};
    case Engine::SubmitResult::ShuttingDown: throw ApiError{503, "the server is shutting down", "", "service_unavailable"};
  }
}

void OpenAIServer::launch(const std::shared_ptr<Flight>& f, const std::function<ParsedRequest()>& parse) {
  const std::shared_ptr<HttpExchange>& ex = f->ex;
  try {
    const ParsedRequest pr = parse();
    if (!pr.grammar_warnings.empty()) {
      std::string w;
      for (const auto& x : pr.grammar_warnings) w += (w.empty() ? "" : "; ") + x;
      for (char& c : w)
        if (c < 0x20 || c > 0x7e) c = '?';  // a header value is printable ASCII
      f->headers.push_back({"X-Fathom-Structured-Output-Warning", w.substr(0, 1000)});
    }
    f->group = engine_->new_group_id();
    // Events are handled on the connection's strand; the flight is kept by the engine's channel
    // only weakly (the exchange's callbacks hold it until the response is complete).
    std::weak_ptr<Flight> weak = f;
    f->chan->set_notify([this, weak] {
      if (auto fl = weak.lock()) fl->ex->post([this, fl] { drain(*fl); });
    });
    ex->on_client_gone([this, f] {
      if (!f->done) engine_->abort(f->group);
    });
    in_flight_.fetch_add(1);  // before the engine can answer it
    f->in_flight = &in_flight_;
    submit(pr, f);
  } catch (const ApiError& e) {
    f->finish();
    return ex->respond(error_response(e, f->anthropic));
  } catch (const std::exception& e) {
    f->finish();
    return ex->respond(error_response(ApiError{400, e.what(), "", ""}, f->anthropic));
  }
  ex->post([this, f] { drain(*f); });
}

void OpenAIServer::handle_generate(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex, bool chat) {
  auto f = std::make_shared<Flight>();
  f->ex = ex;
  launch(f, [&] {
    ParsedRequest pr = parse_request(req.body, chat, ctx_);
    f->job = std::make_unique<CompletionJob>(pr, random_id(chat ? "chatcmpl-" : "cmpl-"), name_,
                                             opts_.api.reasoning_parser == "qwen3", tok_.get(), tool_format_);
    return pr;
  });
}

// The Anthropic request runs as the chat request it translates to; drain() translates back.
void OpenAIServer::handle_messages(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  auto f = std::make_shared<Flight>();
  f->ex = ex;
  f->anthropic = true;
  f->message_id = random_id("msg_");
  launch(f, [&] {
    const AnthropicRequest ar = translate_anthropic_request(req.body, false);
    ParsedRequest pr = parse_request(dump(ar.chat_body), true, ctx_);
    f->job = std::make_unique<CompletionJob>(pr, f->message_id, name_, opts_.api.reasoning_parser == "qwen3",
                                             tok_.get(), tool_format_, [] { return random_id("toolu_"); });
    if (ar.stream) f->events = std::make_unique<AnthropicStream>(f->message_id, name_, int64_t(pr.prompts.at(0).size()));
    return pr;
  });
}

// The Responses request runs as the chat request it translates to; drain() makes the Response.
void OpenAIServer::handle_responses(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  auto f = std::make_shared<Flight>();
  f->ex = ex;
  f->responses = true;
  f->message_id = random_id("resp_");
  f->created_at = int64_t(std::time(nullptr));
  launch(f, [&] {
    ResponsesRequest rr = translate_responses_request(req.body, *responses_);
    ParsedRequest pr = parse_request(dump(rr.chat_body), true, ctx_);
    f->job = std::make_unique<CompletionJob>(pr, f->message_id, name_, opts_.api.reasoning_parser == "qwen3",
                                             tok_.get(), tool_format_, [] { return random_id("call_"); });
    f->echo = std::move(rr.echo);
    f->conversation = std::move(rr.conversation);
    f->store = rr.store;
    if (rr.stream)
      f->response_events = std::make_unique<ResponsesStream>(
          responses_object(f->message_id, f->created_at, name_, f->echo, "in_progress", json::array(), nullptr),
          [](const char* prefix) { return random_id(prefix); });
    return pr;
  });
}

json OpenAIServer::finish_response(Flight& f) {
  const json& chat = f.job->response();
  json output = responses_output(chat, [](const char* prefix) { return random_id(prefix); });
  const bool incomplete = chat.at("choices").at(0).value("finish_reason", "") == "length";
  if (f.store) responses_->put(f.message_id, responses_conversation(f.conversation, output));
  return responses_object(f.message_id, f.created_at, name_, f.echo, incomplete ? "incomplete" : "completed",
                          std::move(output), responses_usage(chat.at("usage")));
}

// The prompt /v1/messages would run, rendered and tokenized: {"input_tokens": n}.
void OpenAIServer::handle_count_tokens(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  try {
    const AnthropicRequest ar = translate_anthropic_request(req.body, true);
    // Counting runs nothing: tools under tool_choice auto need no --tool-call-parser here.
    RequestContext ctx = ctx_;
    ctx.auto_tool_choice = true;
    const ParsedRequest pr = parse_request(dump(ar.chat_body), true, ctx);
    ex->respond(HttpResponse{200, "application/json", dump(json{{"input_tokens", pr.prompts.at(0).size()}}), {}});
  } catch (const ApiError& e) {
    ex->respond(error_response(e, true));
  } catch (const std::exception& e) {
    ex->respond(error_response(ApiError{400, e.what(), "", ""}, true));
  }
}

// vLLM's answer: the ids, their count and the context limit (and each token's text if asked).
void OpenAIServer::handle_tokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  try {
    const TokenizeRequest tr = parse_tokenize_request(req.body, ctx_);
    json strs = nullptr;
    if (tr.return_token_strs) {
      strs = json::array();
      for (int32_t id : tr.tokens) strs.push_back(tok_->decode({uint32_t(id)}, false));
    }
    const json out = {{"count", tr.tokens.size()}, {"max_model_len", ctx_.max_model_len}, {"tokens", tr.tokens},
                      {"token_strs", strs}};
    ex->respond(HttpResponse{200, "application/json", dump(out), {}});
  } catch (const ApiError& e) {
    ex->respond(error_response(e));
  }
}

// vLLM's answer: {"prompt": text}.
void OpenAIServer::handle_detokenize(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
  try {
    const std::vector<int32_t> ids = parse_detokenize_request(req.body, ctx_);
    const json out = {{"prompt", tok_->decode(std::vector<uint32_t>(ids.begin(), ids.end()), false)}};
    ex->respond(HttpResponse{200, "application/json", dump(out), {}});
  } catch (const ApiError& e) {
    ex->respond(error_response(e));
  } catch (const std::exception& e) {  // an id the tokenizer cannot decode (the model's padding)
    ex->respond(error_response(ApiError{400, e.what(), "tokens", "invalid_value"}));
  }
}

void OpenAIServer::drain(Flight& f) {
  if (f.done) return;
  CompletionJob& job = *f.job;
  // /v1/messages streams Anthropic's events made from the chat chunks.
  // /v1/responses streams the Responses events made from them.
  auto sse = [&f](std::string chat_chunks) {
    return f.events ? f.events->feed(chat_chunks) : f.response_events ? f.response_events->feed(chat_chunks) : chat_chunks;
  };
  try {
    if (!f.started) {
      f.started = true;
      if (job.stream()) {
        HttpHeaders h = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
        h.insert(h.end(), f.headers.begin(), f.headers.end());
        f.ex->begin_stream(200, "text/event-stream", std::move(h));
        std::string s = f.events ? f.events->start() : f.response_events ? f.response_events->start() : std::string();
        s += sse(job.sse_start());
        if (!s.empty()) f.ex->write(std::move(s));
      }
    }
    while (auto ev = f.chan->try_pop()) {
      std::string chunk = sse(job.apply(*ev));
      if (!chunk.empty()) f.ex->write(std::move(chunk));
    }
    if (!job.done()) return;
    f.finish();
    f.chan->set_notify(nullptr);
    if (job.stream()) {
      std::string tail = sse(job.sse_end());  // before finish(): it carries the usage
      if (f.events) tail += f.events->finish();
      if (f.response_events) {
        tail += f.response_events->finish();
        if (f.store && f.response_events->completed())
          responses_->put(f.message_id, responses_conversation(f.conversation, f.response_events->output()));
      }
      f.ex->write(std::move(tail));
      f.ex->end_stream();
    } else if (!job.error().empty()) {
      f.ex->respond(error_response(ApiError{500, job.error(), "", "internal_error"}, f.anthropic));
    } else if (job.aborted() && stopping_) {
      f.ex->respond(error_response(ApiError{503, "the server is shutting down", "", "service_unavailable"}, f.anthropic));
    } else {
      const json body = f.anthropic   ? anthropic_message(job.response(), f.message_id)
                        : f.responses ? finish_response(f)
                                      : job.response();
      f.ex->respond(HttpResponse{200, "application/json", dump(body), f.headers});
    }
  } catch (const std::exception& e) {  // assembling the response failed: this request alone ends
    std::fprintf(stderr, "fathom serve: response failed: %s\n", e.what());
    f.finish();
    f.chan->set_notify(nullptr);
    engine_->abort(f.group);
    const ApiError err{500, std::string("internal error: ") + e.what(), "", "internal_error"};
    if (job.stream()) {
      if (f.events) f.ex->write(anthropic_event(anthropic_error_json(err)));
      else if (f.response_events)
        f.ex->write("event: error\ndata: " + dump(json{{"type", "error"}, {"code", "server_error"}, {"message", err.message},
                                                       {"param", nullptr}, {"sequence_number", 0}}) + "\n\n");
      else f.ex->write("data: " + dump(error_json(err)) + "\n\ndata: [DONE]\n\n");
      f.ex->end_stream();
    } else {
      f.ex->respond(error_response(err, f.anthropic));
    }
  }
}

void OpenAIServer::setup_routes() {
  http_->set_pre_routing([this](const HttpRequest& req) -> std::optional<HttpResponse> {
    if (opts_.api.api_key.empty() || req.path.rfind("/v1", 0) != 0) return std::nullopt;
    if (request_has_api_key(req, opts_.api.api_key)) return std::nullopt;
    const bool anthropic = is_anthropic_path(req.path);
    return error_response(ApiError{401, anthropic ? "Invalid or missing API key (send 'x-api-key: <key>' or 'Authorization: Bearer <key>')"
                                                  : "Invalid or missing API key (send 'Authorization: Bearer <key>')",
                                   "", "invalid_api_key"}, anthropic);
  });
  // Cheap routes answer on the IO thread, so that they stay fast however busy the workers are.
  http_->route("GET", "/health", [this](const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) {
    if (stopping_ || !engine_->accepting()) return ex->respond(error_response(ApiError{503, "shutting down", "", ""}));
    ex->respond(HttpResponse{200, "text/plain", "", {}});
  }, /*on_io_thread=*/true);
  http_->route("GET", "/metrics", [this](const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) {
    std::string text = engine_->render_metrics("fathom:", name_);
    // The load gauges again under vLLM's own prefix, which routers' load-aware policies read.
    text += engine_->render_load_gauges("vllm:", name_);
    text += "# HELP fathom:http_connections_open Open HTTP connections.\n# TYPE fathom:http_connections_open gauge\n"
            "fathom:http_connections_open{model_name=\"" + name_ + "\"} " + std::to_string(http_->open_connections()) + "\n";
    ex->respond(HttpResponse{200, "text/plain; version=0.0.4", std::move(text), {}});
  }, true);
  setup_info_routes();
  http_->route("POST", "/v1/completions", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_generate(req, ex, false);
  });
  http_->route("POST", "/tokenize", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_tokenize(req, ex);
  });
  http_->route("POST", "/detokenize", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_detokenize(req, ex);
  });
  http_->route("POST", "/v1/chat/completions", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_generate(req, ex, true);
  });
  http_->route("POST", "/v1/responses", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_responses(req, ex);
  });
  http_->route("POST", "/v1/messages", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_messages(req, ex);
  });
  http_->route("POST", "/v1/messages/count_tokens", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    handle_count_tokens(req, ex);
  });
}

void OpenAIServer::setup_info_routes() {
  auto get_json = [this](const std::string& path, std::function<json()> body) {
    http_->route("GET", path, [body](const HttpRequest&, const std::shared_ptr<HttpExchange>& ex) {
      ex->respond(HttpResponse{200, "application/json", dump(body()), {}});
    }, /*on_io_thread=*/true);
  };
  get_json("/v1/models", [this] { return json{{"object", "list"}, {"data", json::array({model_card()})}}; });
  // OpenAI's retrieve: the card of a served name, else a 404 in OpenAI's error shape.
  http_->route("GET", "/v1/models/*", [this](const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) {
    const std::string id = percent_decode(std::string_view(req.path).substr(std::string_view("/v1/models/").size()));
    const auto& names = ctx_.model_names;
    if (std::find(names.begin(), names.end(), id) == names.end())
      return ex->respond(error_response(ApiError{404, "The model `" + id + "` does not exist.", "model", "model_not_found"}));
    json card = model_card();
    card["id"] = id;
    ex->respond(HttpResponse{200, "application/json", dump(card), {}});
  }, true);
  get_json("/version", [] { return json{{"version", kFathomVersion}}; });
  // SGLang's names, old and new: its gateway asks the new ones when it registers a worker.
  for (const char* p : {"/get_model_info", "/model_info"}) get_json(p, [this] { return sglang_model_info(description_); });
  for (const char* p : {"/get_server_info", "/server_info"}) get_json(p, [this] { return sglang_server_info(description_); });
}

json OpenAIServer::model_card() const {
  return {{"id", name_}, {"object", "model"}, {"created", int64_t(std::time(nullptr))}, {"owned_by", "fathom"},
          {"root", opts_.model}, {"parent", nullptr}, {"max_model_len", ctx_.max_model_len}};
}

void OpenAIServer::drain_then_stop() {
  while (g_signals == 0 && !stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stopping_ = true;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(int64_t(opts_.shutdown_timeout_s * 1000));
  if (in_flight_ > 0)
    std::fprintf(stderr, "fathom serve: draining %d requests (--shutdown-timeout %g s)\n", in_flight_.load(),
                 opts_.shutdown_timeout_s);
  while (in_flight_ > 0 && g_signals < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (in_flight_ > 0) std::fprintf(stderr, "fathom serve: aborting %d requests\n", in_flight_.load());
  engine_->shutdown();  // what is still in flight ends with finish_reason "abort"
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the last responses' bytes go out
  http_->stop();
}

void OpenAIServer::load_output_parsers() {
  const ApiOptions& api = opts_.api;
  if (!api.reasoning_parser.empty() && api.reasoning_parser != "qwen3")
    fail("--reasoning-parser: only 'qwen3' is supported, got '", api.reasoning_parser, "'");
  if (!api.tool_call_parser.empty()) {
    tool_format_ = tool_call_format_from_name(api.tool_call_parser);
    FATHOM_CHECK(tool_format_, "--tool-call-parser: '", api.tool_call_parser, "' is not one of qwen3_coder, hermes");
  }
  FATHOM_CHECK(!api.enable_auto_tool_choice || tool_format_, "--enable-auto-tool-choice needs --tool-call-parser");
  ctx_.auto_tool_choice = api.enable_auto_tool_choice;
}

void OpenAIServer::load_tokenizer() {
  tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_dir(opts_.model));
  // --chat-template (a file) wins over the model's template; special tokens still come from the model.
  if (!opts_.api.chat_template.empty())
    tmpl_ = std::make_unique<chat::ChatTemplate>(chat::load_chat_template(opts_.api.chat_template).source);
  try {
    chat::ChatTemplateSource src = chat::load_chat_template(opts_.model);
    ctx_.special_tokens = src.special_tokens;
    if (!tmpl_) tmpl_ = std::make_unique<chat::ChatTemplate>(src.source);
  } catch (const std::exception& e) {
    if (!tmpl_) {
      ctx_.template_error = e.what();
      std::fprintf(stderr, "fathom serve: no chat template (%s); /v1/chat/completions disabled\n", e.what());
    }
  }
}

void OpenAIServer::report_capacity(const ModelRunner& runner, int64_t max_model_len) const {
  if (runner.kv_capacity_tokens() <= 0) return;
  std::fprintf(stderr, "fathom serve: KV cache %lld tokens of %s (%lld blocks of 16), max-model-len %lld, up to %d sequences\n",
               (long long)runner.kv_capacity_tokens(), kv_cache_dtype_name(runner.kv_cache_dtype()),
               (long long)runner.kv_capacity_tokens() / 16,
               (long long)max_model_len, runner.max_sequences());
  if (const ModelRunner::SnapshotRoom room = runner.snapshot_room(); runner.supports_snapshots() && room.snapshots > 0)
    std::fprintf(stderr, "fathom serve: prefix snapshots: %lld at once, %lld tokens of KV over all (--prefix-cache-mb %lld)\n",
                 (long long)room.snapshots, (long long)room.tokens, (long long)opts_.prefix_cache_mb);
}

std::vector<int32_t> OpenAIServer::end_token_ids(const ModelConfig& mc) const {
  std::vector<int32_t> ids(mc.eos_token_ids.begin(), mc.eos_token_ids.end());
  if (tok_ && ctx_.special_tokens.contains("eos_token") && ctx_.special_tokens.at("eos_token").is_string())
    if (auto id = tok_->token_to_id(ctx_.special_tokens.at("eos_token").get<std::string>())) ids.push_back(int32_t(*id));
  return ids;
}

void OpenAIServer::load_grammars(const std::vector<int32_t>& end_token_ids, int64_t vocab_size) {
  // Grammar masks span the logits' width; the model's eos tokens end a complete output.
  // Stop tokens: the eos ids the tokenizer has as special tokens (a config's eos id can be an
  // ordinary text token, as in the test fixtures); all of them when none is special.
  std::vector<uint32_t> stops;
  for (int32_t id : end_token_ids)
    if (id >= 0 && tok_->is_special(uint32_t(id)) && std::find(stops.begin(), stops.end(), uint32_t(id)) == stops.end())
      stops.push_back(uint32_t(id));
  if (stops.empty()) stops.assign(end_token_ids.begin(), end_token_ids.end());
  grammars_ = std::make_unique<grammar::GrammarCompiler>(
      grammar::Vocabulary::from_tokenizer(*tok_, std::move(stops), size_t(vocab_size)));
  ctx_.grammars = grammars_.get();
}

void OpenAIServer::load() {
  name_ = opts_.api.served_model_name.empty() ? opts_.model : opts_.api.served_model_name;
  responses_ = std::make_unique<ResponseStore>(size_t(opts_.api.responses_store_size));
  load_output_parsers();
  if (!opts_.api.skip_tokenizer_init) load_tokenizer();
  const SpecOptions spec = speculative_options(opts_);
  std::unique_ptr<ModelRunner> runner = open_model(opts_.model, opts_.device,
                                                   /*with_mtp=*/spec.algorithm == SpecAlgorithm::Mtp,
                                                   runner_options(opts_, spec));
  // --sampler device on the CPU engine: the runner chooses tokens with the GPU sampler's
  // semantics, and steps overlap as on the GPU (a GPU engine whose sampler the tuner refused
  // samples on the host, as before).
  if (opts_.sampler == "device" && !runner->samples_on_device() && runner->device_name().rfind("cpu", 0) == 0)
    runner = std::make_unique<RowSamplingRunner>(std::move(runner));
  // One limit for the server and the engine (serve_options.h).
  const int64_t max_model_len = served_max_model_len(opts_, *runner);
  report_capacity(*runner, max_model_len);
  const int64_t kv_tokens = std::max<int64_t>(0, runner->kv_capacity_tokens());
  const int64_t vocab_size = runner->config().vocab_size;
  EngineConfig ec = engine_config(opts_, spec, max_model_len, end_token_ids(runner->config()));
  ec.prefix_cache_host_bytes = prefix_cache_host_bytes(opts_, *runner);
  if (ec.enable_prefix_caching && runner->supports_snapshots())
    std::fprintf(stderr, "fathom serve: prefix cache host tier: %s\n",
                 ec.prefix_cache_host_bytes > 0
                     ? (std::to_string(ec.prefix_cache_host_bytes >> 20) + " MB (--prefix-cache-host-gb)").c_str()
                     : "none (--prefix-cache-host-gb)");
  if (tok_) load_grammars(ec.eos_token_ids, vocab_size);
  engine_ = std::make_unique<Engine>(std::move(runner), tok_.get(), std::move(ec));

  ctx_.tokenizer = tok_.get();
  ctx_.chat_template = tmpl_.get();
  ctx_.model_names = {name_, opts_.model};
  ctx_.vocab_size = vocab_size;
  ctx_.max_model_len = max_model_len;
  ctx_.allow_fault_injection = opts_.api.enable_fault_injection;
  ctx_.schema_best_effort = opts_.api.structured_output_best_effort;
  ctx_.schema_undeclared_keys = opts_.api.undeclared_keys;
  describe(max_model_len, kv_tokens);
}

void OpenAIServer::describe(int64_t max_model_len, int64_t kv_tokens) {
  const ModelConfig& mc = engine_->model_config();
  const EngineConfig& ec = engine_->config();
  description_ = ServerDescription{name_, opts_.model, mc.model_type, mc.architecture, max_model_len, ec.max_num_seqs,
                                   kv_tokens, ec.max_prefill_tokens > 0 ? ec.max_prefill_tokens : ec.max_num_batched_tokens,
                                   opts_.parallel.size, engine_->caches_prefixes(), opts_.api.reasoning_parser,
                                   opts_.api.tool_call_parser};
}

void OpenAIServer::announce() const {
  const EngineConfig& ec = opts_.engine;
  std::fprintf(stderr,
               "fathom serve: %s on %s, listening on http://%s:%d (max-model-len %lld, max-num-seqs %d, "
               "max-num-batched-tokens %lld, chunked-prefill-size %lld, sampler %s, overlap schedule %s, "
               "prefix caching %s, max-connections %d)\n",
               name_.c_str(), engine_->device_name().c_str(), opts_.http.host.c_str(), http_->port(),
               (long long)ctx_.max_model_len, ec.max_num_seqs, (long long)ec.max_num_batched_tokens,
               (long long)(ec.max_prefill_tokens > 0 ? ec.max_prefill_tokens : ec.max_num_batched_tokens),
               opts_.sampler == "host" || !engine_->samples_on_device() ? "host" : "device",
               engine_->overlaps_steps() ? "on" : "off",
               engine_->caches_prefixes()   ? "on"
               : ec.enable_prefix_caching ? "off (this engine has no prefix snapshots)"
                                          : "off",
               http_->max_connections());
  std::fflush(stderr);
}

int OpenAIServer::run() {
  load();
  http_ = std::make_unique<HttpServer>(http_options(opts_, [](int status, const std::string& msg) {
    const char* code = status == 404 ? "not_found" : status == 503 ? "service_unavailable" : "";
    return dump(error_json(ApiError{status, msg, "", code}));
  }));
  setup_routes();
  http_->bind();

  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  engine_->start();
  std::thread watcher([this] { drain_then_stop(); });
  announce();
  http_->run();
  stopping_ = true;
  watcher.join();
  engine_->shutdown();
  return 0;
}

}  // namespace

int run_server(const ServeOptions& options) {
  OpenAIServer s(options);
  return s.run();
}

}  // namespace fathom::server
