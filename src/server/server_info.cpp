#include "server/server_info.h"

namespace fathom::server {

using json = nlohmann::ordered_json;

json sglang_model_info(const ServerDescription& d) {
  return json{{"model_path", d.model_path},
              {"tokenizer_path", d.model_path},
              {"served_model_name", d.served_model_name},
              {"is_generation", true},
              {"preferred_sampling_params", nullptr},
              {"weight_version", "default"},
              {"has_image_understanding", false},
              {"has_audio_understanding", false},
              {"model_type", d.model_type},
              {"architectures", d.architecture.empty() ? json::array() : json::array({d.architecture})}};
}

json sglang_server_info(const ServerDescription& d) {
  auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return json{{"model_path", d.model_path},
              {"tokenizer_path", d.model_path},
              {"served_model_name", d.served_model_name},
              {"context_length", d.context_length},
              {"max_running_requests", d.max_running_requests},
              {"max_total_num_tokens", d.max_total_num_tokens > 0 ? json(d.max_total_num_tokens) : json(nullptr)},
              {"chunked_prefill_size", d.chunked_prefill_size},
              {"page_size", 16},  // the KV block, in tokens
              {"tp_size", d.tp_size},
              {"dp_size", 1},     // replicas are separate servers behind a router
              {"disable_radix_cache", !d.prefix_caching},
              {"reasoning_parser", opt(d.reasoning_parser)},
              {"tool_call_parser", opt(d.tool_call_parser)},
              {"version", "fathom"}};
}

}  // namespace fathom::server
