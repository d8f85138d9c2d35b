// OpenAI-compatible HTTP server (cpp-httplib) over the continuous-batching Engine:
// /v1/models, /v1/completions, /v1/chat/completions (SSE streaming), /health, /metrics.
#pragma once
#include <cstdint>
#include <string>

namespace fathom::server {

struct ServerConfig {
  std::string model;  // checkpoint folder
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;  // default: the model path
  int64_t max_model_len = 0;      // 0: the model's max_position_embeddings
  int max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int max_queue_len = 1024;
  int64_t num_kv_blocks = 0;      // 0: max_num_seqs full-length sequences
  std::string api_key;
  std::string reasoning_parser;   // "" or "qwen3"
  bool skip_tokenizer_init = false;
  std::string device = "cpu";
  std::string load_format = "auto";  // "dummy": random weights at a config's shapes (CUDA)
  int num_layers = 0;                // dummy only: cut depth, keeping the layer pattern
  int http_threads = 0;           // 0: max_num_seqs + max_queue_len + 64
  int listen_backlog = 4096;
  bool log_requests = false;
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
