// Verified kernel backends for the CUDA engine (issue 19), today for the NVFP4 expert kernels:
// op "moe.fp4.decode" (the decode-shaped kernels, candidates d0..d7, bucketed by step tokens)
// and "moe.fp4.prefill" (the prefill-shaped ones, p0..p3). Every candidate runs in child
// processes at the model's MoE widths against a double-precision host reference (NaN/Inf, then
// the error within the bound of the kernels' one rounding, bf16 h: 1e-2 of a row's largest
// value), decode candidates must also be batch invariant; the passing ones are timed per bucket
// and one is chosen per bucket (core/backend_selection.h). Results are cached per GPU, driver,
// CUDA runtime, tuning version and model shape (io/tune_cache.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/backend_selection.h"
#include "io/model_config.h"

namespace fathom::cuda {

struct TuneOptions {
  BackendPolicy policy = BackendPolicy::VerifiedFastest;
  std::string moe_backend;   // --moe-runner-backend: pin a candidate (d<i> for decode, p<i> for prefill)
  bool use_cache = true;     // false: verify and time again, then overwrite the entry
  double timeout_s = 180;    // a child's limit
  // From the command-line flags (--backend-policy, --moe-runner-backend, --no-*-cache).
  static TuneOptions from_flags(const std::string& policy, const std::string& moe_backend, bool use_cache) {
    return TuneOptions{parse_backend_policy(policy), moe_backend, use_cache};
  }
};

struct TuneResult {
  bool tuned = false;        // false: nothing to tune (no NVFP4 experts, or no GPU); see `note`
  std::string note;
  std::string gpu;           // name, compute capability, driver, CUDA runtime
  std::vector<BackendCheck> checks;
  std::vector<BackendChoice> choices;
  bool from_cache = false;
  std::string cache_file;
  double seconds = 0;
};

// Verifies and times the candidates, or reads a previous run's result from the cache. Call it
// before this process initialises CUDA (the work runs in child processes).
TuneResult tune_backends(const ModelConfig& cfg, bool nvfp4_experts, const TuneOptions& opt);
// Makes the kernels follow the choices (process-wide).
void apply_backends(const std::vector<BackendChoice>& choices);
// tune_backends, its describe_backends lines to `log`, then apply_backends when it tuned.
TuneResult tune_and_apply(const ModelConfig& cfg, bool nvfp4_experts, const TuneOptions& opt,
                          const std::function<void(const std::string&)>& log);
// Log lines: each choice with its reason, then every rejected candidate with its failed check.
std::vector<std::string> describe_backends(const TuneResult& r);

}  // namespace fathom::cuda
