// `fathom serve MODEL [--host --port --served-model-name --max-model-len --max-num-seqs
//  --max-num-batched-tokens --api-key --reasoning-parser qwen3 --tool-call-parser qwen3_coder|hermes
//  --enable-auto-tool-choice --skip-tokenizer-init
//  --device auto|cpu|cuda --max-queue-len --speculative-algorithm mtp|nextn|ngram
//  --speculative-num-steps K]`: the OpenAI-compatible HTTP server (vLLM flag names; SGLang's for
//  speculative decoding). The flags fill one server::ServeOptions, which derives every part's
//  options (server/serve_options.h). The add_* functions run in the order of `serve --help`.
#include <cstdlib>
#include <map>
#include <memory>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "server/openai_server.h"

namespace fathom::cli {
namespace {

using server::ServeOptions;

// The engine's limits, scheduling, prefix caching and memory.
void add_engine_options(CLI::App* sub, const std::shared_ptr<ServeOptions>& a) {
  EngineConfig& e = a->engine;
  sub->add_option("--max-model-len", a->max_model_len,
                  "Longest prompt + completion (default: max_position_embeddings, capped by what the KV cache holds)");
  sub->add_option("--max-num-seqs", e.max_num_seqs, "Sequences running at once (linear-attention state slots)")->capture_default_str();
  sub->add_option("--max-num-batched-tokens", e.max_num_batched_tokens, "Token budget of one engine step")->capture_default_str();
  sub->add_option("--chunked-prefill-size", e.max_prefill_tokens,
                  "Prefill tokens that may join one engine step, beside the decoding sequences (SGLang's flag; "
                  "0: up to --max-num-batched-tokens)")
      ->capture_default_str();
  sub->add_option("--sampler", a->sampler,
                  "auto: choose tokens where the logits are (on the GPU; the CPU engine samples on the host); "
                  "device: the engine chooses tokens itself (only ids and asked-for logprobs come back; the CPU "
                  "engine then runs the GPU sampler's semantics and overlapped steps); host: copy the logits and "
                  "sample with the CPU sampler")
      ->check(CLI::IsMember({"auto", "device", "host"}))
      ->capture_default_str();
  sub->add_flag_callback(
      "--enable-prefix-caching", [a] { a->engine.enable_prefix_caching = true; },
      "Reuse the state after a cached prompt prefix (KV, Gated DeltaNet states, MTP KV snapshots at block "
      "boundaries; on by default)");
  sub->add_flag_callback("--no-enable-prefix-caching", [a] { a->engine.enable_prefix_caching = false; }, "No prefix caching");
  sub->add_option("--prefix-cache-interval", e.prefix_cache_interval,
                  "Also snapshot every N tokens inside a prompt, ending prefill chunks there (0: only where chunks end "
                  "anyway and where prompts stop sharing a prefix)")
      ->capture_default_str();
  sub->add_option("--prefix-cache-mb", a->prefix_cache_mb, "Memory for prefix snapshots (least recently used go first)")
      ->capture_default_str();
  sub->add_option("--prefix-cache-host-gb", a->prefix_cache_host_gb,
                  "Host memory for prefix snapshots the device's room evicts (moved back on a hit; least recently "
                  "used dropped first; pinned at start-up). Default (or negative): half the available host memory "
                  "(within the container's limit), at most 128, where the engine keeps snapshots on a device and "
                  "can move them, else none");
  sub->add_flag("--disable-overlap-schedule", a->disable_overlap_schedule,
                "Plan each step only after the previous step's tokens are on the host (SGLang's flag); by default "
                "the next step is planned and launched while the GPU runs this one");
  sub->add_option("--max-queue-len", e.max_queue_len, "Waiting sequences beyond which requests get 429")->capture_default_str();
  sub->add_option("--num-kv-blocks", e.num_kv_blocks,
                  "KV-cache blocks of 16 tokens (default: from --gpu-memory-utilization on CUDA, max-num-seqs "
                  "full-length sequences on the CPU)");
  sub->add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                  "CUDA: share of the GPU's memory for weights, KV cache and buffers; the KV cache takes the rest")
      ->capture_default_str();
  add_kv_cache_dtype_option(sub, a->kv_cache_dtype);
  add_backend_options(sub, a->backends);
}

// Authentication, chat templates, reasoning and tool-call parsing.
void add_api_options(CLI::App* sub, ServeOptions& a) {
  server::ApiOptions& api = a.api;
  sub->add_option("--api-key", api.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1, or 'x-api-key: KEY' on /v1/messages (default: $FATHOM_API_KEY)");
  sub->add_option("--chat-template", api.chat_template, "Chat template file to use instead of the model's (.jinja or tokenizer_config.json)");
  sub->add_option("--reasoning-parser", api.reasoning_parser, "Split <think>...</think> into reasoning_content (qwen3)");
  sub->add_option("--responses-store-size", api.responses_store_size,
                  "/v1/responses: the most recent responses kept for previous_response_id (0: none; the field is then refused)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--tool-call-parser", api.tool_call_parser,
                  "How the model writes tool calls: qwen3_coder (Qwen3.5, Qwen3-Coder XML) or hermes (Qwen3 JSON)");
  sub->add_flag("--enable-auto-tool-choice", api.enable_auto_tool_choice,
                "Let the model decide to call tools (tool_choice \"auto\"); needs --tool-call-parser");
  sub->add_flag("--structured-output-best-effort", api.structured_output_best_effort,
                "JSON Schema keywords that cannot be enforced are left unenforced (a warning header) instead of a 400");
  static const std::map<std::string, grammar::UndeclaredKeys> kUndeclared = {
      {"free-form", grammar::UndeclaredKeys::FreeForm}, {"any", grammar::UndeclaredKeys::Any},
      {"none", grammar::UndeclaredKeys::None}};
  sub->add_option("--structured-output-undeclared-keys", api.undeclared_keys,
                  "Keys a JSON Schema object without additionalProperties may take beyond its declared ones: free-form "
                  "(default: any where it declares none, as {\"type\": \"object\"}; else none, as XGrammar's strict mode), "
                  "any (JSON Schema's rule) or none")
      ->transform(CLI::CheckedTransformer(kUndeclared, CLI::ignore_case));
  sub->add_flag_callback(
      "--structured-outputs-config.disable_additional_properties",
      [&api] { api.undeclared_keys = grammar::UndeclaredKeys::None; },
      "vLLM's name for --structured-output-undeclared-keys none");
  sub->add_flag("--skip-tokenizer-init", api.skip_tokenizer_init, "No tokenizer: token-id prompts only, no text output");
}

// Where the model runs and what it is loaded from.
void add_loading_options(CLI::App* sub, ServeOptions& a) {
  sub->add_option("--device", a.device, "auto (cuda when a GPU is visible), cpu or cuda")->capture_default_str();
  sub->add_option("--load-format", a.load_format, "auto, or dummy: random weights at MODEL's config (CUDA)")->capture_default_str();
  sub->add_option("--num-layers", a.num_layers, "With --load-format dummy: cut depth, keeping the layer pattern");
}

// Connections: their number, deadlines, threads and logging.
void add_http_options(CLI::App* sub, server::HttpServerOptions& http) {
  sub->add_option("--max-connections", http.max_connections,
                  "Open HTTP connections at most; near it idle ones are closed first, past it new ones get 503")
      ->capture_default_str();
  sub->add_option("--http-idle-timeout", http.idle_timeout_s, "Seconds a connection may wait before sending a request")
      ->capture_default_str();
  sub->add_option("--http-request-timeout", http.request_timeout_s,
                  "Seconds a client has to send one request's headers and body")
      ->capture_default_str();
  sub->add_option("--http-workers", http.worker_threads, "Threads that parse and tokenize requests (default: the cores)");
  sub->add_option("--listen-backlog", http.backlog, "TCP listen backlog")->capture_default_str();
  sub->add_flag("--log-requests", http.log_requests, "Log every HTTP request to stderr");
}

CommandRegistrar reg([](CLI::App& app) {
  auto a = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  sub->add_option("model", a->model, "Checkpoint folder")->required();
  sub->add_option("--host", a->http.host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->http.port, "Port to listen on")->capture_default_str();
  sub->add_option("--served-model-name", a->api.served_model_name, "Model name in the API (default: the model path)");
  add_engine_options(sub, a);
  add_api_options(sub, *a);
  add_loading_options(sub, *a);
  add_http_options(sub, a->http);
  sub->add_option("--shutdown-timeout", a->shutdown_timeout_s,
                  "On SIGTERM, seconds the requests in flight get to finish while new ones get 503 (a second signal ends it)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_flag("--enable-fault-injection", a->api.enable_fault_injection,
                "Tests only: accept the request field \"fathom_fault\" that makes the engine fail that request");
  SpecOptions& spec = a->engine.spec;
  add_speculative_options(sub, a->speculative_algorithm, spec.num_steps, spec.ngram_min, spec.ngram_max, spec.adaptive);
  add_parallel_options(sub, a->parallel);
  sub->add_option("--speculative-disable-by-batch-size", spec.disable_by_batch_size,
                  "No drafts in a step with at least this many running sequences (0: no limit; auto: chosen from "
                  "the token rates measured with and without drafts, on engines that overlap steps)")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"auto", "-1"}}));
  sub->add_flag("--speculative-sampled-drafts", spec.sampled_drafts,
                "Fused MTP rounds draw sampled requests' drafts from the MTP layer's distribution q and verify "
                "them with min(1, p/q) (accepted more often than its argmax; lossless). Device sampling (the "
                "GPU, or the CPU engine with --sampler device); seeded requests repeat for the same arrivals");
  sub->callback([a] {
    if (a->api.api_key.empty())
      if (const char* k = std::getenv("FATHOM_API_KEY")) a->api.api_key = k;
    int rc = server::run_server(*a);
    if (rc != 0) std::exit(rc);
  });
});

}  // namespace
}  // namespace fathom::cli
