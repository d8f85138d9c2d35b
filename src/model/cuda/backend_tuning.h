// Verified kernel backends for the CUDA engine (issue 19). Every heavy op of the model
// (model/cuda/backend_op.h: dense bf16 and NVFP4 products at decode sizes, the NVFP4 experts at
// decode and prefill sizes, attention decode and prefill, the delta rule at decode and prefill,
// sampling) lists its candidate implementations; each candidate runs in child processes at the
// model's shapes against a trusted reference (writes outside their buffers, seen by guard zones;
// NaN/Inf, then the error within a bound derived from the precision; decode-side ops also batch
// invariance), the passing ones are timed per bucket
// and one is chosen per bucket (core/backend_selection.h). Results are cached per GPU, driver,
// CUDA runtime, tuning version and model shapes (io/tune_cache.h).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/backend_selection.h"
#include "io/model_config.h"
#include "kernels/cuda/kernel_plan.h"
#include "model/model_runner.h"

namespace fathom::cuda {

struct TuneOptions {
  BackendPolicy policy = BackendPolicy::VerifiedFastest;
  // Pinned candidates per op, from the peers' flags: --moe-runner-backend (d<i>: moe.fp4.decode,
  // p<i>: moe.fp4.prefill), --attention-backend (tensor-core|cuda-core: both attention ops),
  // --fp4-gemm-backend (gemv|dequant-cublaslt: gemm.fp4).
  std::map<std::string, std::string> pinned;
  bool use_cache = true;   // false: verify and time again, then overwrite the entry
  bool speculative = true; // steps verify drafts: decode-side ops keep one bit class over sizes
  double timeout_s = 180;  // a child's limit
};
// From the command-line flags (--backend-policy, the pins, --no-*-cache); throws naming a bad value.
TuneOptions tune_options(const BackendOptions& flags);

struct TuneResult {
  bool tuned = false;        // false: no GPU; see `note`
  std::string note;
  std::string gpu;           // name, compute capability, driver, CUDA runtime
  std::vector<BackendCheck> checks;  // candidate: "op/candidate"
  std::vector<BackendChoice> choices;
  std::map<std::string, std::string> names;  // "op/candidate" -> a longer name, where it has one
  // Without a GPU: the model's ops, their step-size buckets and candidates (what a GPU run would
  // verify), one line each, for planning (`fathom inspect --backends`).
  std::vector<std::string> registry;
  bool from_cache = false;
  std::string cache_file;
  double seconds = 0;
  KernelPlan plan;  // the choices as the runner takes them (tune_and_apply; the fixed rules otherwise)
};

// Verifies and times the candidates, or reads a previous run's result from the cache, and
// chooses. Call it before this process initialises CUDA (the work runs in child processes).
// `nvfp4`: the model's experts (and dense layers) are NVFP4; `fp8`: it has FP8 dense linears.
TuneResult tune_backends(const ModelConfig& cfg, bool nvfp4, const TuneOptions& opt, bool fp8 = false);
// tune_backends, its describe_backends lines to `log`, then the choices as a KernelPlan (in the
// result) for the runner; throws naming the op when one of its sizes has no verified candidate.
TuneResult tune_and_apply(const ModelConfig& cfg, bool nvfp4, const TuneOptions& opt,
                          const std::function<void(const std::string&)>& log, bool fp8 = false);
// Log lines: each choice with its reason, then every rejected candidate with its failed check.
std::vector<std::string> describe_backends(const TuneResult& r);

}  // namespace fathom::cuda
