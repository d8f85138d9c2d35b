#include "server/serve_options.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/host_memory.h"

namespace fathom::server {

SpecOptions speculative_options(const ServeOptions& o) {
  SpecOptions spec = o.engine.spec;
  spec.algorithm = parse_spec_algorithm(o.speculative_algorithm);
  FATHOM_CHECK(spec.disable_by_batch_size >= -1, "--speculative-disable-by-batch-size must be >= 0 or auto");
  FATHOM_CHECK(spec.algorithm == SpecAlgorithm::None || (spec.num_steps >= 1 && spec.num_steps <= 4),
               "--speculative-num-steps must be 1..4 (got ", spec.num_steps, ")");
  return spec;
}

EngineOptions runner_options(const ServeOptions& o, const SpecOptions& spec) {
  EngineOptions eo;
  eo.load_format = o.load_format;
  eo.num_layers = o.num_layers;
  eo.max_seqs = o.engine.max_num_seqs;
  eo.max_model_len = o.max_model_len;
  eo.max_batched_tokens = int(o.engine.max_num_batched_tokens);
  eo.num_kv_blocks = o.engine.num_kv_blocks;
  eo.gpu_memory_utilization = o.gpu_memory_utilization;
  eo.kv_cache_dtype = o.kv_cache_dtype;
  eo.parallel = o.parallel;
  eo.backends = o.backends;
  eo.prefix_cache_mb = o.engine.enable_prefix_caching ? o.prefix_cache_mb : 0;
  eo.backends.speculative = !o.speculative_algorithm.empty();
  if (spec.algorithm != SpecAlgorithm::None) eo.speculative_tokens = spec.num_steps;
  eo.sampled_drafts = spec.algorithm == SpecAlgorithm::Mtp && spec.sampled_drafts;
  return eo;
}

int64_t served_max_model_len(const ServeOptions& o, const ModelRunner& runner) {
  if (o.max_model_len > 0) return o.max_model_len;
  const int64_t model_len = runner.config().max_position_embeddings;
  const int64_t max_len = model_len > 0 ? model_len : 4096;
  return runner.max_sequence_length() > 0 ? std::min(max_len, runner.max_sequence_length()) : max_len;
}

EngineConfig engine_config(const ServeOptions& o, const SpecOptions& spec, int64_t max_model_len,
                           std::vector<int32_t> eos_token_ids) {
  EngineConfig ec = o.engine;
  ec.device_sampling = o.sampler != "host";
  ec.overlap_schedule = !o.disable_overlap_schedule;
  FATHOM_CHECK(o.prefix_cache_mb >= 0, "--prefix-cache-mb must not be negative");
  ec.prefix_cache_bytes = o.prefix_cache_mb << 20;
  ec.max_model_len = max_model_len;
  ec.eos_token_ids = std::move(eos_token_ids);
  ec.spec = spec;
  FATHOM_CHECK(ec.max_num_seqs > 0, "--max-num-seqs must be positive");
  FATHOM_CHECK(ec.max_queue_len >= 0, "--max-queue-len must be >= 0");
  return ec;
}

int64_t prefix_cache_host_bytes(const ServeOptions& o, const ModelRunner& runner) {
  FATHOM_CHECK(std::isfinite(o.prefix_cache_host_gb) && o.prefix_cache_host_gb <= 1e6,
               "--prefix-cache-host-gb must be a number of GB (negative: the default), got ", o.prefix_cache_host_gb);
  if (!o.engine.enable_prefix_caching || !runner.supports_snapshots()) return 0;
  if (o.prefix_cache_host_gb < 0) {  // auto: only where snapshots live on a device
    const bool host_engine = runner.device_name().rfind("cpu", 0) == 0;
    // Pinned at start-up (14-21 GB/s measured): the cap keeps a large host's start within seconds.
    constexpr int64_t kDefaultCap = int64_t(128) << 30;
    return runner.supports_host_snapshots() && !host_engine ? std::min(available_host_memory() / 2, kDefaultCap) : 0;
  }
  FATHOM_CHECK(o.prefix_cache_host_gb == 0 || runner.supports_host_snapshots(), "--prefix-cache-host-gb: the ",
               runner.device_name(), " engine keeps no prefix snapshots in host memory (no host tier yet)");
  const int64_t bytes = int64_t(o.prefix_cache_host_gb * double(int64_t(1) << 30));
  // The GPU engine pins its whole tier at start-up; past what the host has, that is the OOM killer.
  const int64_t available = available_host_memory();
  FATHOM_CHECK(available <= 0 || bytes <= available, "--prefix-cache-host-gb ", o.prefix_cache_host_gb,
               " is more than the host memory available (", available >> 20, " MB)");
  return bytes;
}

HttpServerOptions http_options(const ServeOptions& o,
                               std::function<std::string(int status, const std::string& message)> error_body) {
  HttpServerOptions ho = o.http;
  ho.error_body = std::move(error_body);
  FATHOM_CHECK(ho.idle_timeout_s > 0 && ho.request_timeout_s > 0, "HTTP timeouts must be positive");
  return ho;
}

}  // namespace fathom::server
