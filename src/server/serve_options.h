// Everything `fathom serve` is told, filled once from the flags (cli/cmd_serve.cpp), and the one
// place each part's options come from: the model runner's (open_model), the engine's, the HTTP
// server's. Where a part's own option struct takes a flag as it is, with the flag's default, the
// flag binds straight into it (EngineConfig with its SpecOptions, HttpServerOptions), so the
// value is never copied by hand; what needs translating is derived by the functions below.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "model/model_runner.h"
#include "runtime/engine.h"
#include "server/http_server.h"

namespace fathom::server {

// What the OpenAI layer does with requests and responses.
struct ApiOptions {
  std::string served_model_name;  // default: the model path
  std::string api_key;
  std::string reasoning_parser;   // "" or "qwen3"
  std::string tool_call_parser;   // "", "qwen3_coder" or "hermes" (vLLM's names)
  bool enable_auto_tool_choice = false;  // tool_choice "auto": the model's tool calls become tool_calls
  std::string chat_template;      // a template file (.jinja or tokenizer_config.json) instead of the model's
  bool skip_tokenizer_init = false;
  // JSON Schema keywords a grammar cannot enforce are left unenforced (an
  // X-Fathom-Structured-Output-Warning header names them) instead of a 400.
  bool structured_output_best_effort = false;
  // The keys JSON Schema objects without additionalProperties may take beyond the declared
  // (--structured-output-undeclared-keys; vLLM's disable_additional_properties is None).
  grammar::UndeclaredKeys undeclared_keys = grammar::UndeclaredKeys::FreeForm;
  bool enable_fault_injection = false;  // tests: the "fathom_fault" request field
  // /v1/responses: how many responses previous_response_id can continue (the most recent; 0: none).
  int64_t responses_store_size = 1024;
};

struct ServeOptions {
  std::string model;            // checkpoint folder
  std::string device = "auto";  // cuda when a GPU is visible, else cpu

  // The model runner: how it is loaded and how much of the device it takes.
  std::string load_format = "auto";     // "dummy": random weights at a config's shapes (CUDA)
  int num_layers = 0;                   // dummy only: cut depth, keeping the layer pattern
  double gpu_memory_utilization = 0.9;  // CUDA: share of the device's memory weights + KV + buffers may take
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype (core/kv_cache_dtype.h)
  TensorParallelism parallel;           // ranks the model is split over, and how
  BackendOptions backends;              // CUDA kernel backends (model/cuda/backend_tuning.h)

  // --max-model-len as given: the one source of the limit on prompt + completion (0: the model's
  // max_position_embeddings, capped by what the KV cache holds). The runner is sized from it;
  // served_max_model_len() resolves the limit that the engine and the API share.
  int64_t max_model_len = 0;

  // The engine. The flags bind into `engine`: max_num_seqs, max_num_batched_tokens,
  // max_prefill_tokens (--chunked-prefill-size), max_queue_len, num_kv_blocks,
  // enable_prefix_caching, prefix_cache_interval and spec's steps, n-gram window, adaptive and
  // disable_by_batch_size. engine_config() fills in the rest from the flags below.
  EngineConfig engine;
  std::string sampler = "auto";           // auto: on the GPU when the engine can; device: by the runner
                                          // (the CPU engine: RowSamplingRunner); host
  bool disable_overlap_schedule = false;  // plan each step only after the previous one's tokens are back
  int64_t prefix_cache_mb = 2048;         // prefix snapshots kept, least recently used dropped first
  // The host tier for prefix snapshots (GB; < 0: auto, half the host's available memory on engines
  // whose snapshots live on a device and can move to the host, none elsewhere).
  double prefix_cache_host_gb = -1;
  std::string speculative_algorithm;      // SGLang's names: "", "mtp"/"nextn" or "ngram"

  // SIGTERM: seconds the requests in flight get to finish (new ones get 503) before the rest are
  // aborted and the server exits.
  double shutdown_timeout_s = 30;

  ApiOptions api;
  HttpServerOptions http;  // the flags bind into it; http_options() adds the error body
};

// The speculative decoding asked for: engine.spec with --speculative-algorithm parsed; checked.
SpecOptions speculative_options(const ServeOptions& o);

// How open_model() builds and sizes the runner.
EngineOptions runner_options(const ServeOptions& o, const SpecOptions& spec);

// The limit on prompt + completion that the engine and the API share: --max-model-len, else the
// model's own (4096 when it has none) capped by the longest sequence the runner holds.
int64_t served_max_model_len(const ServeOptions& o, const ModelRunner& runner);

// The engine's configuration: the flags', the served limit and the tokens that end a sequence.
EngineConfig engine_config(const ServeOptions& o, const SpecOptions& spec, int64_t max_model_len,
                           std::vector<int32_t> eos_token_ids);

// --prefix-cache-host-gb resolved for this runner, in bytes (0: no host tier); refuses a size
// the runner cannot use, naming the flag.
int64_t prefix_cache_host_bytes(const ServeOptions& o, const ModelRunner& runner);

// The HTTP server's options; `error_body` renders the errors it produces itself.
HttpServerOptions http_options(const ServeOptions& o,
                               std::function<std::string(int status, const std::string& message)> error_body);

}  // namespace fathom::server
