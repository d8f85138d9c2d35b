// What SGLang's server answers at /get_model_info and /get_server_info (and their newer names
// /model_info and /server_info), which the SGLang Model Gateway reads when it registers a worker
// and forwards when a client asks it. Only the keys that describe this server are given.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace fathom::server {

struct ServerDescription {
  std::string served_model_name, model_path;
  std::string model_type, architecture;  // config.json's
  int64_t context_length = 0;            // --max-model-len as served
  int max_running_requests = 0;          // --max-num-seqs
  int64_t max_total_num_tokens = 0;      // KV cache tokens (0: not known)
  int64_t chunked_prefill_size = 0;
  int tp_size = 1;
  bool prefix_caching = false;
  std::string reasoning_parser, tool_call_parser;
};

nlohmann::ordered_json sglang_model_info(const ServerDescription& d);
nlohmann::ordered_json sglang_server_info(const ServerDescription& d);

}  // namespace fathom::server
