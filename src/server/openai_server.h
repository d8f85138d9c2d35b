// OpenAI-compatible HTTP server over the continuous-batching Engine: /v1/models,
// /v1/completions, /v1/chat/completions (SSE streaming), /health, /metrics. The HTTP side is
// event-driven (http_server.h); responses are assembled from engine events on the connection's
// strand, never on the engine thread, and a client that disconnects aborts its request.
#pragma once
#include <cstdint>
#include <string>

#include "model/model_runner.h"

namespace fathom::server {

struct ServerConfig {
  std::string model;  // checkpoint folder
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;  // default: the model path
  int64_t max_model_len = 0;      // 0: the model's max_position_embeddings, or what the KV cache holds
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t chunked_prefill_size = 0;  // prefill tokens joining one step (0: max_num_batched_tokens)
  std::string sampler = "device";    // device: tokens chosen on the GPU when the engine can; host
  bool disable_overlap_schedule = false;  // plan each step only after the previous one's tokens are back
  // Prefix caching (runtime/prefix_cache.h), where the engine can snapshot sequences.
  bool enable_prefix_caching = true;
  int64_t prefix_cache_interval = 0;      // tokens between forced snapshots inside a prompt (0: none)
  int64_t prefix_cache_mb = 2048;         // snapshots kept, least recently used dropped first
  int max_queue_len = 1024;
  int64_t num_kv_blocks = 0;      // 0: from device memory (CUDA) or max_num_seqs full-length sequences (CPU)
  double gpu_memory_utilization = 0.9;  // CUDA: share of the device's memory weights + KV + buffers may take
  TensorParallelism parallel;           // ranks the model is split over, and how
  BackendOptions backends;  // CUDA kernel backends (model/cuda/backend_tuning.h)
  std::string api_key;
  std::string reasoning_parser;   // "" or "qwen3"
  std::string tool_call_parser;   // "", "qwen3_coder" or "hermes" (vLLM's names)
  bool enable_auto_tool_choice = false;  // tool_choice "auto": the model's tool calls become tool_calls
  std::string chat_template;      // a template file (.jinja or tokenizer_config.json) instead of the model's
  bool skip_tokenizer_init = false;
  std::string device = "auto";  // cuda when a GPU is visible, else cpu
  std::string load_format = "auto";  // "dummy": random weights at a config's shapes (CUDA)
  int num_layers = 0;                // dummy only: cut depth, keeping the layer pattern
  int max_connections = 4096;     // open HTTP connections (idle ones are closed first near it)
  double http_idle_timeout = 5;   // seconds a connection may wait before (the next) request
  double http_request_timeout = 30;  // seconds to deliver one request's headers and body
  int http_workers = 0;           // request parsing threads (0: the number of cores)
  int listen_backlog = 4096;
  bool log_requests = false;
  bool enable_fault_injection = false;  // tests: the "fathom_fault" request field
  // Speculative decoding (SGLang flag names): "", "mtp"/"nextn" or "ngram".
  std::string speculative_algorithm;
  int speculative_num_steps = 3;
  int speculative_ngram_min = 1, speculative_ngram_max = 12;
  bool speculative_adaptive = true;  // per-sequence draft length and back-off
  int speculative_disable_by_batch_size = 0;  // no drafts with this many decoding sequences (0: off)
};

// Loads the model, serves until SIGINT/SIGTERM, returns the process exit code.
int run_server(const ServerConfig& cfg);

}  // namespace fathom::server
