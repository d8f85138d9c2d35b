// `fathom serve MODEL [--host --port --served-model-name --max-model-len --max-num-seqs
//  --max-num-batched-tokens --api-key --reasoning-parser qwen3 --tool-call-parser qwen3_coder|hermes
//  --enable-auto-tool-choice --skip-tokenizer-init
//  --device auto|cpu|cuda --max-queue-len --speculative-algorithm mtp|nextn|ngram
//  --speculative-num-steps K]`: the OpenAI-compatible HTTP server (vLLM flag names; SGLang's for
//  speculative decoding).
#include <cstdlib>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "server/openai_server.h"

namespace fathom::cli {
namespace {

CommandRegistrar reg([](CLI::App& app) {
  auto a = std::make_shared<server::ServerConfig>();
  CLI::App* sub = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  sub->add_option("model", a->model, "Checkpoint folder")->required();
  sub->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", a->port, "Port to listen on")->capture_default_str();
  sub->add_option("--served-model-name", a->served_model_name, "Model name in the API (default: the model path)");
  sub->add_option("--max-model-len", a->max_model_len,
                  "Longest prompt + completion (default: max_position_embeddings, capped by what the KV cache holds)");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "Sequences running at once (linear-attention state slots)")->capture_default_str();
  sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "Token budget of one engine step")->capture_default_str();
  sub->add_option("--chunked-prefill-size", a->chunked_prefill_size,
                  "Prefill tokens that may join one engine step, beside the decoding sequences (SGLang's flag; "
                  "0: up to --max-num-batched-tokens)")
      ->capture_default_str();
  sub->add_option("--sampler", a->sampler,
                  "device: choose tokens on the GPU (only ids and asked-for logprobs come back); host: copy the "
                  "logits and sample on the CPU")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  sub->add_flag_callback(
      "--enable-prefix-caching", [a] { a->enable_prefix_caching = true; },
      "Reuse the state after a cached prompt prefix (KV, Gated DeltaNet states, MTP KV snapshots at block "
      "boundaries; on by default)");
  sub->add_flag_callback("--no-enable-prefix-caching", [a] { a->enable_prefix_caching = false; }, "No prefix caching");
  sub->add_option("--prefix-cache-interval", a->prefix_cache_interval,
                  "Also snapshot every N tokens inside a prompt, ending prefill chunks there (0: only where chunks end "
                  "anyway and where prompts stop sharing a prefix)")
      ->capture_default_str();
  sub->add_option("--prefix-cache-mb", a->prefix_cache_mb, "Memory for prefix snapshots (least recently used go first)")
      ->capture_default_str();
  sub->add_flag("--disable-overlap-schedule", a->disable_overlap_schedule,
                "Plan each step only after the previous step's tokens are on the host (SGLang's flag); by default "
                "the next step is planned and launched while the GPU runs this one");
  sub->add_option("--max-queue-len", a->max_queue_len, "Waiting sequences beyond which requests get 429")->capture_default_str();
  sub->add_option("--num-kv-blocks", a->num_kv_blocks,
                  "KV-cache blocks of 16 tokens (default: from --gpu-memory-utilization on CUDA, max-num-seqs "
                  "full-length sequences on the CPU)");
  sub->add_option("--gpu-memory-utilization", a->gpu_memory_utilization,
                  "CUDA: share of the GPU's memory for weights, KV cache and buffers; the KV cache takes the rest")
      ->capture_default_str();
  add_backend_options(sub, a->backends);
  sub->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on /v1 (default: $FATHOM_API_KEY)");
  sub->add_option("--chat-template", a->chat_template, "Chat template file to use instead of the model's (.jinja or tokenizer_config.json)");
  sub->add_option("--reasoning-parser", a->reasoning_parser, "Split <think>...</think> into reasoning_content (qwen3)");
  sub->add_option("--tool-call-parser", a->tool_call_parser,
                  "How the model writes tool calls: qwen3_coder (Qwen3.5, Qwen3-Coder XML) or hermes (Qwen3 JSON)");
  sub->add_flag("--enable-auto-tool-choice", a->enable_auto_tool_choice,
                "Let the model decide to call tools (tool_choice \"auto\"); needs --tool-call-parser");
  sub->add_flag("--skip-tokenizer-init", a->skip_tokenizer_init, "No tokenizer: token-id prompts only, no text output");
  sub->add_option("--device", a->device, "auto (cuda when a GPU is visible), cpu or cuda")->capture_default_str();
  sub->add_option("--load-format", a->load_format, "auto, or dummy: random weights at MODEL's config (CUDA)")->capture_default_str();
  sub->add_option("--num-layers", a->num_layers, "With --load-format dummy: cut depth, keeping the layer pattern");
  sub->add_option("--max-connections", a->max_connections,
                  "Open HTTP connections at most; near it idle ones are closed first, past it new ones get 503")
      ->capture_default_str();
  sub->add_option("--http-idle-timeout", a->http_idle_timeout, "Seconds a connection may wait before sending a request")
      ->capture_default_str();
  sub->add_option("--http-request-timeout", a->http_request_timeout,
                  "Seconds a client has to send one request's headers and body")
      ->capture_default_str();
  sub->add_option("--http-workers", a->http_workers, "Threads that parse and tokenize requests (default: the cores)");
  sub->add_option("--listen-backlog", a->listen_backlog, "TCP listen backlog")->capture_default_str();
  sub->add_flag("--log-requests", a->log_requests, "Log every HTTP request to stderr");
  sub->add_flag("--enable-fault-injection", a->enable_fault_injection,
                "Tests only: accept the request field \"fathom_fault\" that makes the engine fail that request");
  add_speculative_options(sub, a->speculative_algorithm, a->speculative_num_steps, a->speculative_ngram_min,
                          a->speculative_ngram_max, a->speculative_adaptive);
  add_parallel_options(sub, a->parallel);
  sub->add_option("--speculative-disable-by-batch-size", a->speculative_disable_by_batch_size,
                  "No drafts in a step with at least this many decoding sequences (0: no limit)");
  sub->callback([a] {
    if (a->api_key.empty())
      if (const char* k = std::getenv("FATHOM_API_KEY")) a->api_key = k;
    int rc = server::run_server(*a);
    if (rc != 0) std::exit(rc);
  });
});

}  // namespace
}  // namespace fathom::cli
