// Small helpers shared by the model-running subcommands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model_runner.h"

namespace CLI {
class App;
}

namespace fathom::cli {

// Parses "1,2,3" into token ids; throws fathom::Error on anything else.
std::vector<int32_t> parse_token_ids(const std::string& text);

// The speculative-decoding flags shared by generate, serve and bench (SGLang's names).
void add_speculative_options(CLI::App* sub, std::string& algorithm, int& num_steps, int& ngram_min, int& ngram_max,
                             bool& adaptive);

// --tensor-parallel-size/--tp and --enable-expert-parallel (vLLM's names) and --force-nccl, shared
// by the commands that run a model.
void add_parallel_options(CLI::App* sub, TensorParallelism& parallel);
// --kv-cache-dtype auto|bf16|fp8|fp8_e4m3 (vLLM's flag and values; core/kv_cache_dtype.h).
void add_kv_cache_dtype_option(CLI::App* sub, std::string& dtype);

// `fathom tune` (cmd_tune.cpp): verifies, times and chooses the kernel backends for a model on
// this GPU (or reads the cached choice) and prints every check and choice; also
// `fathom inspect MODEL --backends`.
struct TuneArgs {
  std::string model, json_out;
  BackendOptions backends;
  bool bf16_experts = false;
};
// The kernel-backend flags (--backend-policy, --moe-runner-backend, --attention-backend,
// --fp4-gemm-backend, --no-backend-cache) of serve, bench and tune; `none` also allows the
// unverified fixed rules (bench).
void add_backend_options(CLI::App* sub, BackendOptions& b, bool allow_none = false);
void run_tune(const TuneArgs& a);

}  // namespace fathom::cli
